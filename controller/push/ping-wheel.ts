/**
 * One timer for all push connections' keep-alive pings. A timer per connection would cost a
 * Timeout object and a closure each at 10,000 connections and fire in bursts; the wheel spreads
 * the connections over `slots` buckets and visits one bucket per tick, so every member is
 * visited once per `intervalMs` and the pings are spread evenly over the interval.
 */
export interface WheelMember {
  /** The slot the member sits in, -1 when not in the wheel. Owned by the wheel. */
  wheelSlot: number;
}

export class PingWheel<T extends WheelMember> {
  readonly #slots: Set<T>[];
  readonly #tickMs: number;
  readonly #visit: (member: T) => void;
  #cursor = 0;
  #timer: NodeJS.Timeout | null = null;

  /**
   * @param intervalMs how often each member is visited
   * @param slots buckets (default 30: one tick a second at the 30 s ping interval)
   * @param visit called for each member of the bucket due; must not throw
   */
  constructor(intervalMs: number, visit: (member: T) => void, slots = 30) {
    if (!(intervalMs > 0) || !Number.isInteger(slots) || slots < 1)
      throw new RangeError('intervalMs must be > 0 and slots a positive integer');
    this.#slots = Array.from({ length: slots }, () => new Set<T>());
    this.#tickMs = Math.max(1, Math.floor(intervalMs / slots));
    this.#visit = visit;
  }

  get size(): number {
    let n = 0;
    for (const s of this.#slots) n += s.size;
    return n;
  }

  /**
   * Adds a member to the bucket visited last in the current round, so it is first visited a
   * whole interval from now (round robin over buckets keeps them even).
   */
  add(member: T): void {
    if (member.wheelSlot >= 0) return;
    // the bucket just visited is the one visited again last: a full interval from now
    const slot = (this.#cursor + this.#slots.length - 1) % this.#slots.length;
    this.#slots[slot]!.add(member);
    member.wheelSlot = slot;
    if (this.#timer === null) {
      this.#timer = setInterval(() => this.#tick(), this.#tickMs);
      this.#timer.unref();
    }
  }

  delete(member: T): void {
    if (member.wheelSlot < 0) return;
    this.#slots[member.wheelSlot]?.delete(member);
    member.wheelSlot = -1;
  }

  /** Stops the timer and empties the wheel. */
  clear(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    for (const s of this.#slots) {
      for (const m of s) m.wheelSlot = -1;
      s.clear();
    }
  }

  #tick(): void {
    const bucket = this.#slots[this.#cursor]!;
    this.#cursor = (this.#cursor + 1) % this.#slots.length;
    // copy: a visit may delete members (a dead connection) while we iterate
    for (const m of [...bucket]) this.#visit(m);
  }
}
