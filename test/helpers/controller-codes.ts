/** The code of the HeraldError `p` rejects with, or undefined when it resolves (or rejects uncoded). */
import { codeOf } from '../../protocol/errors.js';

export async function rejectedCode(p: Promise<unknown> | (() => Promise<unknown>)): Promise<string | undefined> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (err) {
    return codeOf(err);
  }
  return undefined;
}
