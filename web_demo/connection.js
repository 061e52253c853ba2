// One WebSocket to /v1/tts/ws: opens it, decodes text vs binary messages, and
// explains failures. A browser never sees the HTTP status of a refused
// handshake (503 arrives as a bare close 1006), so after a failed open we ask
// again over plain HTTP, to tell "busy" from "down".

import { closeReason, isBusyClose } from "./protocol.js";

export class Connection extends EventTarget {
  #url;
  #ws = null;

  constructor(url) {
    super();
    this.#url = url;
  }

  /** Where the next open() goes (the API key is in its query). */
  set url(url) {
    this.#url = url;
  }

  get isOpen() {
    return this.#ws?.readyState === WebSocket.OPEN;
  }

  open() {
    this.close();
    // No subprotocol offered on purpose: it is optional, and a browser fails the
    // handshake if it offers one the server does not echo.
    const ws = new WebSocket(this.#url);
    ws.binaryType = "arraybuffer";
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.#emit("open");
    };
    ws.onmessage = (event) => this.#receive(event.data);
    ws.onclose = async (event) => {
      if (this.#ws !== ws) return; // superseded by a newer open()/close()
      this.#ws = null;
      const why = opened ? closeDetails(event) : await probeRefusal(event, this.#url);
      this.#emit("closed", { ...why, wasOpen: opened });
    };
    this.#ws = ws;
  }

  close() {
    const ws = this.#ws;
    this.#ws = null;
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000, "client closed");
  }

  /** Send one JSON control message; returns false when not connected. */
  send(message) {
    if (!this.isOpen) return false;
    this.#ws.send(JSON.stringify(message));
    this.#emit("sent", message);
    return true;
  }

  #receive(data) {
    if (data instanceof ArrayBuffer) {
      this.#emit("frame", data);
      return;
    }
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      this.#emit("message", { type: "error", code: "bad_json", message: "unparseable text from server" });
      return;
    }
    this.#emit("message", message);
  }

  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

function closeDetails(event) {
  return { code: event.code, busy: isBusyClose(event.code), text: closeReason(event.code, event.reason) };
}

/**
 * The handshake was refused or the server is unreachable: find out which by asking the same URL over
 * plain HTTP. The server runs its admission checks before the upgrade, so it answers with the status
 * the browser hid from us (503 + Retry-After when full or draining, 401 without a valid token).
 */
async function probeRefusal(event, url) {
  const httpUrl = url.replace(/^ws/, "http");
  try {
    const response = await fetch(httpUrl, { cache: "no-store" });
    const body = await response.json().catch(() => null);
    const message = body?.error?.message;
    const detail = message ? `: ${message}` : "";
    const retryAfterS = Number(response.headers.get("Retry-After")) || null;
    if (response.status === 503) return { code: event.code, busy: true, retryAfterS, text: `Server busy${detail}` };
    if (response.status === 401) {
      return { code: event.code, busy: false, unauthorised: true, text: "Not authorised: missing or wrong API key" };
    }
    return { code: event.code, busy: false, text: `WebSocket handshake failed (HTTP ${response.status})` };
  } catch {
    return { code: event.code, busy: false, text: "Server unreachable" };
  }
}
