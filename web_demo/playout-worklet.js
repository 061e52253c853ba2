// AudioWorklet: the page's one jitter buffer, clocked by the audio device.
//
// Every decoded frame (Opus via WebCodecs, PCM, mu-law) lands here as float32
// samples at its context's rate with its pts. Contexts play one after another,
// gaplessly, in the order they were opened. A context starts (and restarts
// after an underrun) once `prebufferMs` of it is queued, or at once when it has
// ended. Rates other than the AudioContext's are resampled here, per context,
// with a read position carried across frames: resampling each frame on its own
// would click at every seam.

const FADE_MS = 8; // barge-in fade-out: long enough not to click, short enough to feel instant
const STATUS_QUANTA = 16; // post status every 16 x 128 frames (~43 ms at 48 kHz)
const MAX_GAP_S = 1; // a pts jump larger than this is not filled with silence

class Stream {
  constructor(ctx, rate, outRate) {
    this.ctx = ctx;
    this.rate = rate;
    this.step = rate / outRate; // source samples per output sample
    this.buf = new Float32Array(rate); // one second; grows as needed
    this.start = 0; // index of the first unplayed sample in buf
    this.end = 0; // index after the last queued sample
    this.pos = 0; // fractional read offset from `start`
    this.nextPts = null; // pts the next pushed frame should have
    this.ended = false;
    this.playing = false;
    this.started = false;
    this.played = 0; // source samples played
    this.fadeLeft = -1; // output samples of fade-out left; -1 = not fading
  }

  available() {
    return this.end - this.start - this.pos;
  }

  /** Queue samples at `pts`, honouring the timeline: fill small gaps, drop overlaps. */
  push(pts, samples, rate) {
    if (this.nextPts === null) {
      // The first frame fixes the timeline and, for Opus, the decoder's real output rate.
      this.nextPts = pts;
      this.rate = rate;
      this.step = rate / sampleRate;
    }
    if (pts > this.nextPts) {
      this.#append(new Float32Array(Math.min(pts - this.nextPts, this.rate * MAX_GAP_S)));
      this.nextPts = pts;
    } else if (pts < this.nextPts) {
      const overlap = this.nextPts - pts;
      if (overlap >= samples.length) return;
      samples = samples.subarray(overlap);
    }
    this.#append(samples);
    this.nextPts += samples.length;
  }

  #append(samples) {
    if (this.end + samples.length > this.buf.length) {
      // Drop the played part; grow only when the live part itself does not fit.
      const live = this.end - this.start;
      if (live + samples.length <= this.buf.length) {
        this.buf.copyWithin(0, this.start, this.end);
      } else {
        const grown = new Float32Array(2 * (live + samples.length));
        grown.set(this.buf.subarray(this.start, this.end));
        this.buf = grown;
      }
      this.start = 0;
      this.end = live;
    }
    this.buf.set(samples, this.end);
    this.end += samples.length;
  }

  /** Linear interpolation at the read position; exact copy when rates match. */
  sample() {
    const i = Math.floor(this.pos);
    const frac = this.pos - i;
    const a = this.buf[this.start + i];
    if (frac === 0 || this.start + i + 1 >= this.end) return a;
    return a + (this.buf[this.start + i + 1] - a) * frac;
  }

  advance() {
    this.pos += this.step;
    const whole = Math.floor(this.pos);
    if (whole > 0) {
      this.start += whole;
      this.pos -= whole;
      this.played += whole;
    }
  }
}

class PlayoutProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.streams = []; // play order
    this.byCtx = new Map();
    this.cancelled = new Set();
    this.prebufferMs = 100;
    this.underruns = 0;
    this.playedAfterCancel = {}; // ctx -> output samples of fade-out
    this.peaks = [];
    this.quanta = 0;
    this.port.onmessage = (event) => this.#command(event.data);
  }

  #command(msg) {
    switch (msg.type) {
      case "config":
        this.prebufferMs = msg.prebufferMs;
        break;
      case "open":
        if (this.byCtx.has(msg.ctx) || this.cancelled.has(msg.ctx)) return;
        this.byCtx.set(msg.ctx, new Stream(msg.ctx, msg.rate, sampleRate));
        this.streams.push(this.byCtx.get(msg.ctx));
        break;
      case "push":
        this.byCtx.get(msg.ctx)?.push(msg.pts, msg.samples, msg.rate);
        break;
      case "end": {
        const stream = this.byCtx.get(msg.ctx);
        if (stream) stream.ended = true;
        break;
      }
      case "cancel":
        this.#cancel(msg.ctx);
        break;
    }
  }

  #cancel(ctx) {
    this.cancelled.add(ctx);
    const stream = this.byCtx.get(ctx);
    if (!stream) return;
    this.byCtx.delete(ctx);
    if (stream === this.streams[0] && stream.playing) {
      // Audible now: fade out from what is already queued, then drop the rest.
      stream.fadeLeft = Math.round((FADE_MS / 1000) * sampleRate);
      stream.ended = true;
      this.playedAfterCancel[ctx] = 0;
    } else {
      this.streams.splice(this.streams.indexOf(stream), 1);
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    let n = 0;
    while (n < out.length && this.streams.length > 0) {
      const stream = this.streams[0];
      if (!stream.playing && !this.#ready(stream, n)) break;
      n = this.#render(stream, out, n);
      if (n < out.length) this.#dry(stream);
    }
    this.#meter(out);
    return true;
  }

  #ready(stream, offset) {
    const queuedMs = (stream.available() * 1000) / stream.rate;
    if (!stream.ended && queuedMs < this.prebufferMs) return false;
    stream.playing = true;
    if (!stream.started && stream.available() > 0) {
      stream.started = true;
      this.port.postMessage({ type: "started", ctx: stream.ctx, frame: currentFrame + offset });
    }
    return true;
  }

  /** Copy samples of `stream` into `out` from `n`; returns the new fill level. */
  #render(stream, out, n) {
    const fading = stream.fadeLeft >= 0;
    const fadeTotal = (FADE_MS / 1000) * sampleRate;
    while (n < out.length && stream.available() >= 1 && stream.fadeLeft !== 0) {
      let value = stream.sample();
      if (fading) {
        value *= stream.fadeLeft / fadeTotal;
        stream.fadeLeft -= 1;
        this.playedAfterCancel[stream.ctx] += 1;
      }
      out[n++] = value;
      stream.advance();
    }
    return n;
  }

  /** The head stream has nothing left for this quantum: finished, or an underrun. */
  #dry(stream) {
    if (stream.ended) {
      this.streams.shift();
      if (this.byCtx.get(stream.ctx) === stream) this.byCtx.delete(stream.ctx);
      const cancelled = stream.fadeLeft >= 0;
      this.port.postMessage({ type: "finished", ctx: stream.ctx, played: stream.played, cancelled });
      return;
    }
    stream.playing = false;
    this.underruns += 1;
    this.port.postMessage({ type: "underrun", ctx: stream.ctx, frame: currentFrame });
  }

  #meter(out) {
    let peak = 0;
    for (let i = 0; i < out.length; i++) peak = Math.max(peak, Math.abs(out[i]));
    this.peaks.push(peak);
    if (++this.quanta % STATUS_QUANTA !== 0) return;
    let bufferedMs = 0;
    const played = {};
    for (const stream of this.streams) {
      bufferedMs += (stream.available() * 1000) / stream.rate;
      played[stream.ctx] = stream.played;
    }
    this.port.postMessage({
      type: "status",
      frame: currentFrame,
      bufferedMs,
      underruns: this.underruns,
      playing: this.streams[0]?.playing ? this.streams[0].ctx : null,
      played,
      playedAfterCancel: { ...this.playedAfterCancel },
      peaks: this.peaks,
    });
    this.peaks = [];
  }
}

registerProcessor("tts-playout", PlayoutProcessor);
