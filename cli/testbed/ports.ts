/**
 * Ports for the testbed's processes. Herald's own processes can listen on port 0 and say where
 * they listen (the controller logs it, the agent announces it); a port picked here first is for
 * what must keep its port across restarts (a controller started again, PostgreSQL) or be known
 * before the start.
 */
import net from 'node:net';

/**
 * A port free right now on 127.0.0.1: racy by nature (another process may bind it before the
 * child does, which shows as the child's exit with EADDRINUSE).
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => (a && typeof a === 'object' ? resolve(a.port) : reject(new Error('no port'))));
    });
  });
}

/** A TCP port below the ephemeral range, from `from` up, that is free on 127.0.0.1 now. */
export async function freeLowPort(from = 18443): Promise<number> {
  for (let p = from; p < from + 2000; p++) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(p, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (ok) return p;
  }
  throw new Error(`no free port from ${from} to ${from + 1999}`);
}
