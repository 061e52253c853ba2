// The microphone as one recording: getUserMedia + MediaRecorder in a container the server
// decodes (WebM or Ogg with Opus), stopped by hand or at the server's longest voice.

// What MediaRecorder is asked for, best first; `container` must be among /info's upload formats.
const CANDIDATES = [
  { mimeType: "audio/webm;codecs=opus", container: "webm" },
  { mimeType: "audio/ogg;codecs=opus", container: "ogg" },
];
// Stop this much before the limit: the container's length runs a frame or two past the wall clock, and a busy
// page runs the timer late (a loaded 2-core CI machine can be a few hundred ms late).
const STOP_MARGIN_S = 0.5;

/** Why the microphone cannot be used here, in words, or null when it can. */
export function microphoneProblem(formats) {
  if (!navigator.mediaDevices?.getUserMedia) return "the microphone needs https or http on localhost";
  if (typeof MediaRecorder === "undefined") return "this browser cannot record audio (no MediaRecorder)";
  if (!pickFormat(formats)) return "this browser records no format the server accepts; upload a file instead";
  return null;
}

function pickFormat(formats) {
  return CANDIDATES.find((c) => formats.includes(c.container) && MediaRecorder.isTypeSupported(c.mimeType));
}

/**
 * One recording at a time. Events: "stop" with { blob, seconds, filename, auto } once the audio is
 * complete (`auto`: stopped at the limit).
 */
export class Recorder extends EventTarget {
  #recorder = null;
  #startedAt = 0;
  #timer = null;

  get recording() {
    return this.#recorder !== null;
  }

  get elapsedS() {
    return this.recording ? (performance.now() - this.#startedAt) / 1000 : 0;
  }

  /** Asks for the microphone (the browser may prompt) and starts; rejects with the browser's error. */
  async start({ formats, maxSeconds }) {
    if (this.recording) return;
    const format = pickFormat(formats);
    // A voice is cloned from what the microphone really hears: no echo cancelling, denoising or gain riding.
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    const recorder = new MediaRecorder(stream, { mimeType: format.mimeType });
    const chunks = [];
    let auto = false;
    recorder.ondataavailable = (event) => event.data.size && chunks.push(event.data);
    recorder.onstop = () => {
      const seconds = (performance.now() - this.#startedAt) / 1000;
      for (const track of stream.getTracks()) track.stop(); // release the microphone (and its indicator)
      clearTimeout(this.#timer);
      this.#recorder = null;
      const blob = new Blob(chunks, { type: recorder.mimeType || format.mimeType });
      const detail = { blob, seconds, filename: `recording.${format.container}`, auto };
      this.dispatchEvent(new CustomEvent("stop", { detail }));
    };
    recorder.start();
    this.#recorder = recorder;
    this.#startedAt = performance.now();
    this.#timer = setTimeout(
      () => {
        auto = true;
        this.stop();
      },
      Math.max(0, maxSeconds - STOP_MARGIN_S) * 1000,
    );
  }

  stop() {
    if (this.#recorder?.state === "recording") this.#recorder.stop();
  }
}
