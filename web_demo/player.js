// Routes binary frames to per-context decoders and the decoded samples into the
// playout worklet (the one jitter buffer). Owns every audio figure the page
// shows and the counters the browser tests assert on.
//
// Cancel fence: once `cancel(ctx)` runs, that context's decoder is closed (its
// queued outputs never fire), later frames of it are counted and dropped, and
// the worklet fades out and forgets it. Nothing of it is decoded or played again.

import { FrameFlag, FrameKind, parseFrame } from "./protocol.js";
import { OpusDecoder, SampleDecoder } from "./decoders.js";

const OUTPUT_RATE = 48000; // AudioContext rate; other rates are resampled in the worklet

class ContextAudio {
  constructor(ctx, handle, output) {
    this.ctx = ctx;
    this.handle = handle;
    this.format = output.format;
    this.sampleRate = output.sample_rate;
    this.frameMs = output.frame_ms;
    this.decoder = null;
    this.nextSeq = 0;
    this.counts = {
      framesReceived: 0,
      bytesReceived: 0,
      framesDecoded: 0,
      samplesDecoded: 0, // at decodedRate
      decodedRate: null,
      samplesPlayed: 0, // at the context's rate, reported by the worklet
      seqGaps: 0,
      lateFrames: 0,
      lastSeq: -1,
      segments: 0,
      cancelled: false,
      framesDroppedAfterCancel: 0,
      framesDecodedAfterCancel: 0,
      outputSamplesAfterCancel: 0, // fade-out only: bounded by the worklet's FADE_MS
      ended: false, // no more audio will come
      finished: false, // ... and the worklet has played all of it
      firstFrameAt: null, // performance.now()
      playbackStartedAt: null,
    };
  }
}

export class Player extends EventTarget {
  #audio = null;
  #node = null;
  #starting = null;
  #prebufferMs = 100;
  #contexts = new Map(); // ctx -> ContextAudio (kept after the end, for figures)
  #byHandle = new Map(); // handle -> ContextAudio of a live context
  totals = { framesReceived: 0, bytesReceived: 0, underruns: 0, bufferedMs: 0, playing: null, contextsCancelled: 0 };

  /** Create the AudioContext and worklet; call from a user gesture (autoplay policy). */
  start() {
    this.#starting ??= this.#init().catch((error) => {
      this.#starting = null; // let the next click try again
      throw error;
    });
    return this.#starting;
  }

  async #init() {
    if (typeof AudioWorkletNode === "undefined") throw new Error("AudioWorklet is not available on this page");
    this.#audio = new AudioContext({ sampleRate: OUTPUT_RATE, latencyHint: "interactive" });
    await this.#audio.audioWorklet.addModule(new URL("./playout-worklet.js", import.meta.url));
    this.#node = new AudioWorkletNode(this.#audio, "tts-playout", { numberOfInputs: 0, outputChannelCount: [1] });
    this.#node.port.onmessage = (event) => this.#fromWorklet(event.data);
    this.#node.connect(this.#audio.destination);
    this.#post({ type: "config", prebufferMs: this.#prebufferMs });
    if (this.#audio.state === "suspended") await this.#audio.resume();
  }

  set prebufferMs(ms) {
    this.#prebufferMs = ms;
    this.#post({ type: "config", prebufferMs: ms });
  }

  get prebufferMs() {
    return this.#prebufferMs;
  }

  /** A context was created (`context.created`): set up its decoder and its place in the play queue. */
  open(ctx, handle, output) {
    const audio = new ContextAudio(ctx, handle, output);
    const onSamples = (pts, samples, rate) => this.#decoded(audio, pts, samples, rate);
    audio.decoder =
      output.format === "opus"
        ? new OpusDecoder(output.sample_rate, onSamples, (error) => this.#emit("error", { ctx, error }))
        : new SampleDecoder(output.format, output.sample_rate, onSamples);
    this.#contexts.set(ctx, audio);
    this.#byHandle.set(handle, audio);
    // Opening now fixes the play order; an Opus decoder's real output rate arrives with its first push.
    this.#post({ type: "open", ctx, rate: output.sample_rate });
  }

  /** One binary frame from the socket. */
  receive(buffer) {
    const frame = parseFrame(buffer);
    this.totals.framesReceived += 1;
    this.totals.bytesReceived += buffer.byteLength;
    const audio = this.#byHandle.get(frame.handle);
    if (!audio) return; // a frame of a context we already released: nothing to play
    if (audio.counts.cancelled) {
      audio.counts.framesDroppedAfterCancel += 1;
      return;
    }
    if (frame.kind === FrameKind.CODEC_HEADER) {
      audio.decoder.configure(frame.payload);
      return;
    }
    if (frame.kind !== FrameKind.AUDIO) return;
    this.#account(audio, frame, buffer.byteLength);
    if (frame.seq < audio.nextSeq) return; // duplicate or late: its pts is already played
    audio.nextSeq = frame.seq + 1;
    // An empty payload only carries the end-of-context flag (docs/protocol.md): nothing to decode.
    if (frame.payload.byteLength > 0) audio.decoder.decode(frame.pts, frame.payload);
    if (frame.flags & FrameFlag.CONTEXT_END) this.end(audio.ctx);
  }

  #account(audio, frame, bytes) {
    const c = audio.counts;
    if (c.firstFrameAt === null) {
      c.firstFrameAt = performance.now();
      this.#emit("firstaudio", { ctx: audio.ctx });
    }
    c.framesReceived += 1;
    c.bytesReceived += bytes;
    if (frame.seq > audio.nextSeq) c.seqGaps += 1;
    if (frame.seq < audio.nextSeq) c.lateFrames += 1;
    c.lastSeq = Math.max(c.lastSeq, frame.seq);
    if (frame.flags & FrameFlag.SEGMENT_END) c.segments += 1;
  }

  #decoded(audio, pts, samples, rate) {
    const c = audio.counts;
    if (c.cancelled) {
      c.framesDecodedAfterCancel += 1; // must stay 0: closing the decoder drops its queue
      return;
    }
    c.framesDecoded += 1;
    c.samplesDecoded += samples.length;
    c.decodedRate = rate;
    this.#post({ type: "push", ctx: audio.ctx, pts, rate, samples }, [samples.buffer]);
  }

  /** No more audio will come for ctx (last frame, `context.done`): play out its tail. */
  end(ctx) {
    const audio = this.#contexts.get(ctx);
    if (!audio || audio.counts.ended) return;
    audio.counts.ended = true;
    // Opus outputs lag the last decode() call; let them land before closing the stream.
    const flushed = audio.decoder instanceof OpusDecoder ? audio.decoder.flush() : Promise.resolve();
    flushed.finally(() => this.#post({ type: "end", ctx }));
  }

  /** Barge-in: stop ctx now. Nothing of it is decoded or played after this call. */
  cancel(ctx) {
    const audio = this.#contexts.get(ctx);
    if (!audio || audio.counts.cancelled) return;
    audio.counts.cancelled = true;
    audio.decoder.close();
    this.totals.contextsCancelled += 1;
    this.#post({ type: "cancel", ctx });
  }

  /** The server has confirmed the context is over (`context.done` / `context.cancelled`). */
  release(ctx) {
    const audio = this.#contexts.get(ctx);
    if (audio && this.#byHandle.get(audio.handle) === audio) this.#byHandle.delete(audio.handle);
  }

  context(ctx) {
    return this.#contexts.get(ctx)?.counts ?? null;
  }

  /** Plain-data snapshot for the UI and the test hook. */
  snapshot() {
    const contexts = {};
    for (const [ctx, audio] of this.#contexts) {
      contexts[ctx] = { format: audio.format, sampleRate: audio.sampleRate, handle: audio.handle, ...audio.counts };
    }
    const sum = (key) => Object.values(contexts).reduce((total, c) => total + c[key], 0);
    return {
      ...this.totals,
      audioContextRate: this.#audio?.sampleRate ?? null,
      audioContextState: this.#audio?.state ?? "not started",
      framesDecoded: sum("framesDecoded"),
      samplesDecoded: sum("samplesDecoded"),
      framesDecodedAfterCancel: sum("framesDecodedAfterCancel"),
      framesDroppedAfterCancel: sum("framesDroppedAfterCancel"),
      contexts,
    };
  }

  #fromWorklet(msg) {
    if (msg.type === "status") {
      this.totals.underruns = msg.underruns;
      this.totals.bufferedMs = msg.bufferedMs;
      this.totals.playing = msg.playing;
      for (const [ctx, played] of Object.entries(msg.played)) {
        const audio = this.#contexts.get(ctx);
        if (audio) audio.counts.samplesPlayed = played;
      }
      for (const [ctx, samples] of Object.entries(msg.playedAfterCancel)) {
        const audio = this.#contexts.get(ctx);
        if (audio) audio.counts.outputSamplesAfterCancel = samples;
      }
    } else if (msg.type === "started") {
      const audio = this.#contexts.get(msg.ctx);
      if (audio) audio.counts.playbackStartedAt = performance.now();
    } else if (msg.type === "finished") {
      const audio = this.#contexts.get(msg.ctx);
      if (audio) {
        audio.counts.samplesPlayed = msg.played;
        audio.counts.finished = true;
      }
    }
    this.#emit(msg.type, msg);
  }

  #post(message, transfer = []) {
    this.#node?.port.postMessage(message, transfer);
  }

  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}
