// Output level as a scrolling strip of peak bars: a person sees at a glance
// whether sound is coming out, where the gaps are, and how loud it is.

const SECONDS = 6;
const QUANTUM = 128; // frames per worklet peak

export class LevelMeter {
  #canvas;
  #columns;
  #perColumn;
  #pending = 0; // peaks gathered toward the next column
  #pendingMax = 0;
  #dirty = false;

  constructor(canvas, sampleRate = 48000) {
    this.#canvas = canvas;
    this.#columns = new Float32Array(240);
    this.#perColumn = Math.max(1, Math.round((SECONDS * sampleRate) / QUANTUM / this.#columns.length));
    new ResizeObserver(() => this.#draw()).observe(canvas);
  }

  /** Peaks (0..1), one per 128-frame render quantum, oldest first. */
  push(peaks) {
    for (const peak of peaks) {
      this.#pendingMax = Math.max(this.#pendingMax, peak);
      if (++this.#pending < this.#perColumn) continue;
      this.#columns.copyWithin(0, 1);
      this.#columns[this.#columns.length - 1] = this.#pendingMax;
      this.#pending = 0;
      this.#pendingMax = 0;
    }
    if (!this.#dirty) {
      this.#dirty = true;
      requestAnimationFrame(() => this.#draw());
    }
  }

  /** Latest level in dBFS, for the readout next to the strip. */
  get levelDb() {
    const peak = Math.max(...this.#columns.subarray(-4));
    return peak > 0 ? 20 * Math.log10(peak) : -Infinity;
  }

  #draw() {
    this.#dirty = false;
    const canvas = this.#canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = Math.round(canvas.clientWidth * ratio);
    const height = Math.round(canvas.clientHeight * ratio);
    if (!width || !height) return;
    if (canvas.width !== width || canvas.height !== height) {
      canvas.width = width;
      canvas.height = height;
    }
    const g = canvas.getContext("2d");
    const style = getComputedStyle(canvas);
    g.clearRect(0, 0, width, height);
    g.fillStyle = style.getPropertyValue("--meter-axis").trim() || "#ccc";
    g.fillRect(0, Math.floor(height / 2), width, Math.max(1, ratio));
    g.fillStyle = style.getPropertyValue("--meter-bar").trim() || "#36c";
    const step = width / this.#columns.length;
    const barWidth = Math.max(1, step * 0.7);
    for (let i = 0; i < this.#columns.length; i++) {
      // sqrt maps speech levels (mostly -30..-6 dBFS) onto a readable bar height.
      const bar = Math.sqrt(Math.min(1, this.#columns[i])) * (height - 2 * ratio);
      if (bar < ratio) continue;
      g.fillRect(i * step, (height - bar) / 2, barWidth, bar);
    }
  }
}
