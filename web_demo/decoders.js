// Payload -> float32 samples, one decoder per context. Each decoder calls
// `onSamples(pts, samples, rate)` with pts on the decoder's output clock.

/** Opus through WebCodecs. The OpusHead frame (kind 2) becomes `description`. */
export class OpusDecoder {
  #decoder = null;
  #pending = []; // packets that arrived before the OpusHead (should not happen, but costs nothing)
  #rate;
  #onSamples;
  #onError;
  closed = false;

  constructor(rate, onSamples, onError) {
    this.#rate = rate;
    this.#onSamples = onSamples;
    this.#onError = onError;
  }

  static async isSupported(rate = 48000) {
    if (typeof AudioDecoder === "undefined") return false;
    const config = { codec: "opus", sampleRate: rate, numberOfChannels: 1 };
    return (await AudioDecoder.isConfigSupported(config)).supported;
  }

  configure(opusHead) {
    if (this.closed || typeof AudioDecoder === "undefined") {
      this.#onError(new Error("WebCodecs AudioDecoder is not available (needs a secure context: https or localhost)"));
      return;
    }
    this.#decoder = new AudioDecoder({
      output: (data) => this.#output(data),
      error: (error) => this.#onError(error),
    });
    this.#decoder.configure({
      codec: "opus",
      sampleRate: this.#rate,
      numberOfChannels: 1,
      description: opusHead.slice(),
    });
    for (const [pts, packet] of this.#pending) this.decode(pts, packet);
    this.#pending = [];
  }

  decode(pts, packet) {
    if (this.closed) return;
    if (!this.#decoder) {
      this.#pending.push([pts, packet.slice()]);
      return;
    }
    // Timestamps in microseconds on the 48 kHz Opus clock; the decoder carries them to the output.
    const timestamp = Math.round((pts * 1e6) / this.#rate);
    this.#decoder.decode(new EncodedAudioChunk({ type: "key", timestamp, data: packet }));
  }

  #output(data) {
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
    const pts = Math.round((data.timestamp * data.sampleRate) / 1e6);
    const rate = data.sampleRate;
    data.close();
    this.#onSamples(pts, samples, rate);
  }

  /** Resolves once every packet given so far has been output (or the decoder was closed). */
  flush() {
    if (this.closed || !this.#decoder || this.#decoder.state !== "configured") return Promise.resolve();
    return this.#decoder.flush().catch(() => {}); // rejects with AbortError when closed meanwhile
  }

  /** Drop everything queued in the decoder: its pending outputs never fire. */
  close() {
    this.closed = true;
    this.#pending = [];
    if (this.#decoder && this.#decoder.state !== "closed") this.#decoder.close();
  }
}

/** PCM and mu-law need no codec: convert synchronously. */
export class SampleDecoder {
  #convert;
  #rate;
  #onSamples;
  closed = false;

  constructor(format, rate, onSamples) {
    this.#convert = CONVERTERS[format];
    if (!this.#convert) throw new Error(`no decoder for ${format}`);
    this.#rate = rate;
    this.#onSamples = onSamples;
  }

  configure() {}

  decode(pts, payload) {
    if (!this.closed) this.#onSamples(pts, this.#convert(payload), this.#rate);
  }

  close() {
    this.closed = true;
  }
}

// Payload views start 20 bytes into the frame, so 16- and 32-bit views are aligned.
// Typed arrays use the platform's byte order, which is little-endian on every browser platform.
const CONVERTERS = {
  pcm_s16le(payload) {
    const ints = new Int16Array(payload.buffer, payload.byteOffset, payload.byteLength >> 1);
    const out = new Float32Array(ints.length);
    for (let i = 0; i < ints.length; i++) out[i] = ints[i] / 32768;
    return out;
  },
  pcm_f32le(payload) {
    return new Float32Array(payload.buffer.slice(payload.byteOffset, payload.byteOffset + payload.byteLength));
  },
  mulaw(payload) {
    const out = new Float32Array(payload.length);
    for (let i = 0; i < payload.length; i++) out[i] = MULAW[payload[i]];
    return out;
  },
};

// G.711 mu-law expansion table (ITU-T G.711), scaled to [-1, 1).
const MULAW = (() => {
  const table = new Float32Array(256);
  for (let i = 0; i < 256; i++) {
    const u = ~i & 0xff;
    const magnitude = ((((u & 0x0f) << 3) + 0x84) << ((u & 0x70) >> 4)) - 0x84;
    table[i] = (u & 0x80 ? -magnitude : magnitude) / 32768;
  }
  return table;
})();
