/** The code of the HeraldError `fn` throws, or undefined when it throws none (or an uncoded one). */
import { codeOf } from '../../protocol/errors.js';

export function thrownCode(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return codeOf(err);
  }
  return undefined;
}

/** The code of the HeraldError `p` rejects with, or undefined when it resolves (or rejects uncoded). */
export async function thrownCodeAsync(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (err) {
    return codeOf(err);
  }
  return undefined;
}
