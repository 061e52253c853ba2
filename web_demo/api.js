// The server's HTTP API (docs/http.md) as the page uses it: JSON in and out, the API key
// as a bearer token, and OpenAI-shaped error bodies turned into one error type.

/** A refused or failed request: HTTP status, and the server's `code` and `message` when it sent them. */
export class ApiError extends Error {
  constructor(status, code, message, { param = null, retryAfterS = null } = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
    this.retryAfterS = retryAfterS;
  }
}

export class HttpApi {
  /** The API key sent as `Authorization: Bearer`; empty when the server needs none. */
  key = "";
  /** The key that adds and deletes voices on a server with `--admin-key` (it replaces the API key there). */
  adminKey = "";

  /** GET /info: the model, its voice roles and the upload limits (needs no key). */
  info() {
    return this.request("GET", "/info");
  }

  listVoices() {
    return this.request("GET", "/v1/voices");
  }

  /** POST /v1/voices with `audio` (a Blob or File) and the text fields; resolves to the stored voice. */
  addVoice({ audio, filename, name, transcript, role }) {
    const form = new FormData();
    form.append("audio", audio, filename);
    form.append("name", name);
    form.append("transcript", transcript);
    form.append("role", role);
    return this.request("POST", "/v1/voices", form, this.adminKey || this.key);
  }

  deleteVoice(id) {
    return this.request("DELETE", `/v1/voices/${encodeURIComponent(id)}`, undefined, this.adminKey || this.key);
  }

  async request(method, path, body = undefined, key = this.key) {
    const headers = key ? { Authorization: `Bearer ${key}` } : {};
    let response;
    try {
      response = await fetch(path, { method, headers, body, cache: "no-store" });
    } catch (error) {
      throw new ApiError(0, "unreachable", `the server did not answer (${error.message ?? error})`);
    }
    const payload = await response.json().catch(() => null);
    if (response.ok && payload !== null) return payload;
    const error = payload?.error ?? {};
    const retryAfterS = Number(response.headers.get("Retry-After")) || null;
    throw new ApiError(response.status, error.code ?? `http_${response.status}`, error.message ?? response.statusText, {
      param: error.param ?? null,
      retryAfterS,
    });
  }
}
