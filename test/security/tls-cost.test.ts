/**
 * The measurement behind SECURITY.md's "RSA or EC" paragraph: server CPU per full mutual TLS 1.3
 * handshake with RSA-2048 and P-256 certificates. Not an attack and not run by default (it is a
 * benchmark): `HERALD_MEASURE_TLS=1 npx vitest run test/security/tls-cost.test.ts`.
 */
import os from 'node:os';
import { describe, expect, it } from 'vitest';
import { measureAll } from './helpers/tls-cost.js';

describe.skipIf(!process.env.HERALD_MEASURE_TLS)('tls cost', () => {
  it('server CPU per full mutual TLS 1.3 handshake, RSA-2048 and P-256', async () => {
    const costs = await measureAll(Number(process.env.HERALD_MEASURE_TLS_N ?? 600));
    const cpu = os.cpus()[0]?.model ?? '?';
    process.stdout.write(
      `\n${new Date().toISOString().slice(0, 10)}, Node ${process.version}, ${os.cpus().length} × ${cpu}\n`,
    );
    for (const c of costs)
      process.stdout.write(
        `${c.kind.padEnd(32)} ${c.serverCpuMs.toFixed(2)} ms server CPU/handshake, ${c.wallMs.toFixed(2)} ms wall (${c.handshakes} handshakes)\n`,
      );
    for (const c of costs) expect(c.handshakes).toBeGreaterThan(0);
  }, 300_000);
});
