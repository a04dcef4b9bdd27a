/**
 * `herald certs issue|init` SAN options through the real CLI process: every
 * --ip/--dns value is checked and normalised before a key is made, so an address node-forge
 * cannot encode as written is either rewritten to a form it can or refused as one line
 * `herald: bad_option: ...` naming the option, never `unexpected error` with a stack.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initPki } from '../../certs/pki.js';
import { runCli, tempDir } from '../cli/harness.js';

let dir: string;
let pki: string;

beforeAll(async () => {
  dir = tempDir('herald-cli-san-');
  pki = path.join(dir, 'pki');
  await initPki({ dir: pki });
}, 60_000);

afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function expectOneLine(stderr: string, code: string, mentions: string): void {
  const lines = stderr.trim().split('\n');
  expect(lines, stderr).toHaveLength(1);
  expect(lines[0]).toMatch(new RegExp(`^herald: ${code}: `));
  expect(lines[0]).toContain(mentions);
  expect(stderr).not.toMatch(/unexpected error|\n\s+at /);
}

function ipSans(certPath: string): string[] {
  const alt = new crypto.X509Certificate(fs.readFileSync(certPath)).subjectAltName ?? '';
  return [...alt.matchAll(/IP Address:([^,\s]+)/g)].map((m) => m[1]!.toLowerCase());
}

describe('herald certs: SAN options', { timeout: 60_000 }, () => {
  it('--ip ::ffff:169.254.169.254 (a dotted IPv4 tail node-forge refuses) is issued with that address, not a stack trace', async () => {
    const r = await runCli([
      'certs',
      'issue',
      'agent',
      'n4',
      '--dir',
      pki,
      '--ip',
      '::ffff:169.254.169.254',
      '--ip',
      'fd00:ec2::254',
      '--ip',
      '10.0.0.5',
    ]);
    expect(r.stderr).not.toMatch(/unexpected error|\n\s+at /);
    expect(r.code, r.stderr).toBe(0);
    // Node prints IPv6 SANs uncompressed: the bytes are those of the address given
    expect(ipSans(path.join(pki, 'agent', 'n4.crt'))).toEqual([
      '0:0:0:0:0:ffff:a9fe:a9fe',
      'fd00:ec2:0:0:0:0:0:254',
      '10.0.0.5',
    ]);
  });

  it.each([
    ['an IPv6 address with a zone', 'fe80::1%eth0'],
    ['three octets', '10.0.0'],
    ['an octet over 255', '10.0.0.256'],
    ['a name', 'agent.example'],
    ['two ::', '1::2::3'],
  ])('--ip with %s is one line bad_option naming --ip', async (_what, ip) => {
    const r = await runCli(['certs', 'issue', 'agent', 'n5', '--dir', pki, '--ip', ip]);
    expect(r.code).toBe(1);
    expectOneLine(r.stderr, 'bad_option', '--ip');
    expect(fs.existsSync(path.join(pki, 'agent', 'n5.crt'))).toBe(false);
  });

  it('--dns with a space or an underscore is one line bad_option naming --dns', async () => {
    for (const name of ['bad name', 'a_b.example', '-x.example']) {
      const r = await runCli(['certs', 'issue', 'agent', 'n6', '--dir', pki, '--dns', name]);
      expect(r.code).toBe(1);
      expectOneLine(r.stderr, 'bad_option', '--dns');
    }
  });

  it('certs init normalises --controller-ip the same way and refuses a bad one naming it', async () => {
    const ok = path.join(dir, 'pki2');
    const r = await runCli(['certs', 'init', '--dir', ok, '--controller-ip', '::ffff:10.1.2.3']);
    expect(r.code, r.stderr).toBe(0);
    expect(ipSans(path.join(ok, 'controller', 'controller.crt'))).toEqual(['127.0.0.1', '0:0:0:0:0:ffff:a01:203']);
    const bad = await runCli(['certs', 'init', '--dir', path.join(dir, 'pki3'), '--controller-ip', '::ffff:300.1.2.3']);
    expect(bad.code).toBe(1);
    expectOneLine(bad.stderr, 'bad_option', '--controller-ip');
  });
});
