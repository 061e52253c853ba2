// Feeds a paragraph to the server the way an LLM would: small tokens at a
// steady rate. The split only has to look like LLM output; the one rule is
// that the tokens join back to the exact text, because the server never
// inserts spaces.

const TOKEN = /\s*[\p{L}\p{M}]{1,7}|\s*\p{N}{1,3}|\s*[^\s\p{L}\p{M}\p{N}]|\s+/gu;

/** " Streaming", " text", "," ... : leading whitespace stays with its token, long words split. */
export function tokenize(text) {
  const tokens = text.match(TOKEN) ?? [];
  return tokens.join("") === text ? tokens : Array.from(text);
}

/** Sends `tokens` one by one through `send(token, index)` at `rate` tokens per second. */
export class TokenFeeder extends EventTarget {
  #tokens;
  #send;
  #timer = null;
  #next = 0;
  rate;

  constructor(tokens, rate, send) {
    super();
    this.#tokens = tokens;
    this.rate = rate;
    this.#send = send;
  }

  get running() {
    return this.#timer !== null;
  }

  get sent() {
    return this.#next;
  }

  get total() {
    return this.#tokens.length;
  }

  start() {
    this.#tick();
  }

  stop() {
    clearTimeout(this.#timer);
    this.#timer = null;
  }

  #tick() {
    if (this.#next >= this.#tokens.length) {
      this.#timer = null;
      this.dispatchEvent(new Event("done"));
      return;
    }
    this.#send(this.#tokens[this.#next], this.#next);
    this.#next += 1;
    this.dispatchEvent(new Event("progress"));
    // The rate is read on every tick so the slider takes effect mid-stream.
    this.#timer = setTimeout(() => this.#tick(), 1000 / Math.max(this.rate, 0.1));
  }
}
