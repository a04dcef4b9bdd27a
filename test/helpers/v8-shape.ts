/**
 * V8's own answer to "are this object's properties still in fast mode?" (`%HasFastProperties`).
 * An object whose properties went to dictionary mode (a property deleted that was not the last
 * one added, for one) holds a hash table of them: ~3 KB for a TLS socket. The natives syntax is
 * allowed from here on in this test process; the check is compiled after that.
 */
import v8 from 'node:v8';

let check: ((o: object) => boolean) | undefined;

export function hasFastProperties(o: object): boolean {
  if (check === undefined) {
    v8.setFlagsFromString('--allow-natives-syntax');
    // compiled only now: the natives syntax is checked when the source is parsed
    check = new Function('o', 'return %HasFastProperties(o)') as (o: object) => boolean;
  }
  return check(o);
}
