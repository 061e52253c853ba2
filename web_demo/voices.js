// The Voices panel: the server's voices (GET /v1/voices), adding one from a file or the
// microphone (POST /v1/voices), deleting an upload, and the Voice select of the Input panel
// that `context.create` takes its voice from. Limits and roles come from GET /info.

import { Recorder, microphoneProblem } from "./recorder.js";
import * as ui from "./ui.js";

const { $ } = ui;

const ROLE_LABELS = {
  prompt: "Prompt (continuation)",
  reference: "Reference (timbre)",
  both: "Both",
};
const ROLE_HINTS = {
  prompt: "The model continues from the audio: its transcript must say exactly what it says.",
  reference: "The audio gives the timbre only; no transcript needed.",
  both: "The audio is both a prompt and a timbre reference: the closest clone.",
};

// The server's error codes (docs/http.md, "Voices") in words; its message follows.
const ERROR_TITLES = {
  unreachable: "Server unreachable",
  starting: "The server is still starting",
  audio_empty: "The file is empty",
  audio_corrupt: "The file is not audio the server can read",
  audio_format: "Unsupported audio format",
  audio_too_short: "Too short",
  audio_too_long: "Too long",
  audio_too_big: "File too big",
  body_too_large: "File too big",
  audio_silent: "The audio is silent",
  audio_decode_timeout: "The audio took too long to decode",
  missing_field: "Something is missing",
  bad_request: "Not accepted",
  transcript_too_long: "Transcript too long",
  voice_too_long: "Too long for the model to speak after",
  unsupported: "The model does not support this role",
  too_many_uploads: "The server is busy with other uploads; try again shortly",
  too_many_voices: "The server's voice store is full",
  voice_fixed: "Built-in voices cannot be deleted",
  voice_not_found: "No such voice (deleted elsewhere?)",
  storage_error: "The server could not store the voice",
  engine_error: "The engine could not encode the audio now",
};

export class VoicePanel extends EventTarget {
  #api;
  #recorder = new Recorder();
  #info = null; // GET /info once it has answered
  #listing = null; // the last GET /v1/voices `data`, or null while it cannot be read
  #listError = null; // why it cannot, in words
  #helloIds = null; // hello.voices of the last session: the fallback when the listing cannot be read
  #source = "file";
  #recording = null; // { blob, seconds, filename } of the last recording
  #recordTicker = null;
  #busy = false;

  /**
   * `api`: an HttpApi. Events: "error" for everything the panel shows as an error; detail: `{ error }` (an ApiError)
   * and `admin` (the request needed the admin key).
   */
  constructor(api) {
    super();
    this.#api = api;
    $("voice-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.#add();
    });
    $("voices-refresh").addEventListener("click", () => this.refresh());
    $("voice-record").addEventListener("click", () => this.#toggleRecording());
    $("voice-role").addEventListener("change", () => this.#renderForm());
    $("voice-file").addEventListener("change", () => this.#renderForm());
    $("voice-list").addEventListener("click", (event) => this.#onListClick(event));
    $("voice").addEventListener("change", () => this.#renderList());
    for (const button of document.querySelectorAll("[data-source]")) {
      button.addEventListener("click", () => this.#setSource(button.dataset.source));
    }
    this.#recorder.addEventListener("stop", (event) => this.#onRecorded(event.detail));
  }

  /** The voice ids listed (the HTTP listing, or hello's when it cannot be read). */
  get ids() {
    return this.#listing ? this.#listing.map((v) => v.id) : (this.#helloIds ?? ["default"]);
  }

  /** Reads the limits (once they have answered) and the listing. */
  async load() {
    if (!this.#info) {
      try {
        this.#info = await this.#api.info();
        this.#setStatus(null);
      } catch (error) {
        this.#setStatus(this.#fail("Cannot read the server's limits", error), "error");
      }
      this.#renderForm();
    }
    await this.refresh();
  }

  /** A session opened: its hello lists the voice ids, and the listing may have changed meanwhile. */
  connected(hello) {
    this.#helloIds = hello.voices?.length ? hello.voices : ["default"];
    this.#fillSelect();
    return this.load();
  }

  async refresh() {
    try {
      this.#listing = (await this.#api.listVoices()).data;
      this.#listError = null;
    } catch (error) {
      this.#listing = null;
      this.#listError = this.#fail("Cannot list the voices", error);
    }
    this.#fillSelect();
    this.#renderList();
  }

  // ---- the list and the Voice select

  #fillSelect(selected = $("voice").value) {
    const ids = this.ids;
    const byId = new Map((this.#listing ?? []).map((v) => [v.id, v]));
    ui.fillSelect($("voice"), ids, {
      label: (id) => byId.get(id)?.name ?? id,
      selected: ids.includes(selected) ? selected : ids[0],
    });
  }

  #renderList() {
    const list = $("voice-list");
    list.replaceChildren();
    if (!this.#listing) {
      const empty = document.createElement("li");
      empty.className = "voice-empty muted";
      const session = this.#helloIds ? ` Voices of this session: ${this.#helloIds.join(", ")}.` : "";
      empty.textContent = `${this.#listError ?? "Not listed yet."}${session}`;
      list.append(empty);
      return;
    }
    const current = $("voice").value;
    for (const voice of this.#listing) {
      const item = document.createElement("li");
      item.dataset.id = voice.id;
      if (voice.id === current) item.setAttribute("aria-current", "true");
      const main = document.createElement("div");
      main.className = "voice-main";
      const name = document.createElement("b");
      name.textContent = voice.name;
      const role = document.createElement("span");
      role.className = "badge";
      role.textContent = voice.role;
      const meta = document.createElement("small");
      const parts = [voice.source, voice.duration_s ? `${voice.duration_s.toFixed(1)} s` : null];
      if (voice.name !== voice.id) parts.push(voice.id);
      meta.textContent = parts.filter(Boolean).join(" · ");
      meta.title = voice.transcript || "";
      main.append(name, role, meta);
      const use = button("Use", "use", voice.id === current ? "Speaking with this voice" : "Speak with this voice");
      use.disabled = voice.id === current;
      item.append(main, use);
      if (voice.source === "upload") item.append(button("Delete", "delete", "Delete this voice from the server"));
      list.append(item);
    }
  }

  #onListClick(event) {
    const action = event.target.closest("button")?.dataset.action;
    const id = event.target.closest("li")?.dataset.id;
    if (!action || !id) return;
    if (action === "use") this.#use(id);
    if (action === "delete") this.#delete(id);
  }

  #use(id) {
    $("voice").value = id;
    this.#renderList();
    ui.log("local", "voice", `speaking with ${id}`);
  }

  async #delete(id) {
    const voice = this.#listing?.find((v) => v.id === id);
    if (!window.confirm(`Delete the voice "${voice?.name ?? id}" from the server?`)) return;
    ui.log("out", "DELETE /v1/voices", id);
    try {
      await this.#api.deleteVoice(id);
      ui.log("in", "deleted", id);
      this.#setStatus(`Deleted ${voice?.name ?? id}.`, "ok");
    } catch (error) {
      this.#setStatus(this.#fail(`Cannot delete ${voice?.name ?? id}`, error, true), "error");
    }
    await this.refresh();
  }

  // ---- the add form

  #setSource(source) {
    if (source !== "mic") this.#recorder.stop();
    this.#source = source;
    for (const button of document.querySelectorAll("[data-source]")) {
      button.setAttribute("aria-checked", String(button.dataset.source === source));
    }
    for (const el of document.querySelectorAll("[data-source-panel]")) el.hidden = el.dataset.sourcePanel !== source;
    this.#renderForm();
  }

  /** The form as /info allows it: roles the model has, length limits, the limits line, the buttons. */
  #renderForm() {
    const uploads = this.#info?.voices?.uploads;
    const roles = this.#info?.voices?.roles ?? ["prompt"];
    const role = $("voice-role");
    if (role.options.length !== roles.length) {
      ui.fillSelect(role, roles, { label: (r) => ROLE_LABELS[r] ?? r, selected: roles[0] });
    }
    role.disabled = roles.length < 2; // a model without reference audio takes prompts only
    role.title = ROLE_HINTS[role.value] ?? "";
    const needsTranscript = role.value !== "reference";
    $("voice-transcript").disabled = !needsTranscript;
    $("voice-transcript").placeholder = needsTranscript
      ? "Exactly what the audio says"
      : "Not needed: a reference gives the timbre only";
    if (uploads) {
      $("voice-name").maxLength = uploads.max_name_chars;
      $("voice-transcript").maxLength = uploads.max_transcript_chars;
      const formats = uploads.formats.map((f) => f.toUpperCase()).join(", ");
      $("voice-limits").textContent =
        `${formats} · up to ${ui.formatBytes(uploads.max_bytes)} · ` +
        `${uploads.min_duration_s}–${uploads.max_duration_s} s of clear speech`;
      $("voice-file").accept = [...uploads.formats.map((f) => `.${f}`), ".opus", "audio/*"].join(",");
    }
    const recording = this.#recorder.recording;
    const mic = this.#source === "mic";
    const problem = uploads && mic ? microphoneProblem(uploads.formats) : null;
    $("voice-record").disabled = !uploads || Boolean(problem) || this.#busy;
    $("voice-record").textContent = recording ? "■ Stop" : this.#recording ? "● Record again" : "● Record";
    $("voice-record").classList.toggle("recording", recording);
    if (problem) $("voice-record-time").textContent = `Microphone unavailable: ${problem}`;
    $("voice-add").disabled = !uploads || this.#busy || recording;
    $("voice-add").textContent = this.#busy ? "Adding…" : "Add voice";
  }

  async #toggleRecording() {
    if (this.#recorder.recording) {
      this.#recorder.stop();
      return;
    }
    const uploads = this.#info.voices.uploads;
    this.#setStatus(null);
    $("voice-record").disabled = true; // until the browser (or the person, at its prompt) answers for the microphone
    try {
      await this.#recorder.start({ formats: uploads.formats, maxSeconds: uploads.max_duration_s });
    } catch (error) {
      const why = error.name === "NotAllowedError" ? "the browser or the user refused access" : error.message;
      this.#setStatus(`Cannot record: ${why || error.name}`, "error");
      this.#renderForm();
      return;
    }
    ui.log("local", "recording", `up to ${uploads.max_duration_s} s`);
    const tick = () => {
      $("voice-record-time").textContent = `${this.#recorder.elapsedS.toFixed(1)} s / ${uploads.max_duration_s} s`;
    };
    tick();
    this.#recordTicker = setInterval(tick, 100);
    this.#renderForm();
  }

  #onRecorded(recording) {
    clearInterval(this.#recordTicker);
    this.#recording = recording;
    const preview = $("voice-preview");
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.src = URL.createObjectURL(recording.blob);
    preview.hidden = false;
    const seconds = recording.seconds.toFixed(1);
    const size = ui.formatBytes(recording.blob.size);
    const limit = recording.auto ? " (stopped at the server's limit)" : "";
    $("voice-record-time").textContent = `Recorded ${seconds} s · ${size}${limit}`;
    ui.log("local", "recorded", `${seconds} s · ${recording.blob.type} · ${size}`);
    this.#renderForm();
  }

  /** The audio to upload, or why there is none yet (checked here against /info's limits first). */
  #audio() {
    const uploads = this.#info.voices.uploads;
    let audio;
    if (this.#source === "file") {
      const file = $("voice-file").files[0];
      if (!file) return { problem: "Choose an audio file first." };
      audio = { blob: file, filename: file.name };
    } else {
      if (!this.#recording) return { problem: "Record something first." };
      if (this.#recording.seconds < uploads.min_duration_s) {
        return { problem: `The recording is shorter than the server's ${uploads.min_duration_s} s.` };
      }
      audio = this.#recording;
    }
    if (audio.blob.size > uploads.max_bytes) {
      const sizes = `${ui.formatBytes(audio.blob.size)}; the server takes at most ${ui.formatBytes(uploads.max_bytes)}`;
      return { problem: `The audio is too big: ${sizes}.` };
    }
    return audio;
  }

  async #add() {
    const audio = this.#audio();
    const name = $("voice-name").value.trim();
    const role = $("voice-role").value;
    const transcript = role === "reference" ? "" : $("voice-transcript").value.trim();
    const problem =
      audio.problem ??
      (!name ? "Give the voice a name." : null) ??
      (role !== "reference" && !transcript ? "Type what the audio says: the model continues from it." : null);
    if (problem) {
      this.#setStatus(problem, "error");
      return;
    }
    this.#busy = true;
    this.#renderForm();
    this.#setStatus(`Uploading ${ui.formatBytes(audio.blob.size)} and encoding it on the server…`, "info");
    ui.log("out", "POST /v1/voices", `${audio.filename} · ${ui.formatBytes(audio.blob.size)} · ${role}`);
    try {
      const voice = await this.#api.addVoice({ audio: audio.blob, filename: audio.filename, name, transcript, role });
      ui.log("in", "voice", `${voice.id} · ${voice.name} · ${voice.duration_s} s`);
      await this.refresh();
      this.#use(voice.id);
      this.#setStatus(`Added ${voice.name} (${voice.id}, ${voice.duration_s.toFixed(1)} s): speaking with it now.`, "ok");
      this.#resetForm();
    } catch (error) {
      this.#setStatus(this.#fail("The server refused the voice", error, true), "error");
    } finally {
      this.#busy = false;
      this.#renderForm();
    }
  }

  #resetForm() {
    $("voice-file").value = "";
    $("voice-name").value = "";
    $("voice-transcript").value = "";
    this.#recording = null;
    $("voice-preview").hidden = true;
    $("voice-record-time").textContent = "";
  }

  // ---- messages

  /**
   * Logs and reports a failed request (`admin`: one that adds or deletes a voice); returns it in words: what
   * failed, the server's message and code.
   */
  #fail(what, error, admin = false) {
    const where = error.status ? `HTTP ${error.status} · ${error.code}` : error.code;
    ui.log("in", "error", `${where} · ${error.message}`, "error");
    this.dispatchEvent(new CustomEvent("error", { detail: { error, admin } }));
    const unauthorised = admin
      ? "Not authorised to change voices: enter the admin key (or the API key) in the Server panel"
      : "Not authorised: enter the server's API key in the Server panel";
    const title = error.code === "unauthorized" ? unauthorised : (ERROR_TITLES[error.code] ?? what);
    return `${title}. ${error.message} (${where})`;
  }

  #setStatus(text, level = "info") {
    const status = $("voice-status");
    status.hidden = !text;
    status.textContent = text ?? "";
    status.dataset.level = level;
  }
}

function button(text, action, title) {
  const el = document.createElement("button");
  el.type = "button";
  el.className = action === "delete" ? "link danger" : "link";
  el.dataset.action = action;
  el.textContent = text;
  el.title = title;
  return el;
}
