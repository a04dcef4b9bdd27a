/**
 * Attacks on what a real `bin/herald agent` believes and runs: a controller API impersonated
 * (an agent's certificate, another controller's, a foreign or expired one), metadata altered,
 * replayed, re-addressed or rolled back by a fake controller that holds the real controller
 * certificate (what a tampering middlebox would need), names that would escape or steer the
 * hook runner, an output path replaced by a symlink, unsafe hooks, hidden inputs looked for
 * everywhere, and a corrupt revoked.json. Each case proves from the outside that no work ran:
 * no marker file, no run dir, an unchanged state dir, no signal.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentState } from '../../agent/state.js';
import type { MetadataItem } from '../../protocol/heat.js';
import { Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import { newNonce, sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { newSigningJwk, revoke, rotateSigningKey } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import { Attackers } from './helpers/attackers.js';
import {
  assertNoWork,
  Battery,
  isBuilt,
  jsonLines,
  sleep,
  SETTLE_MS,
  snapshotDir,
  waitFor,
  type AgentProc,
  type Cred,
} from './helpers/battery.js';
import { FakeController, type MetadataAnswer } from './helpers/fake-controller.js';
import { api } from '../helpers/procs.js';
import { ask, closeAllWs, openWs, rawUpgrade, validWake } from './helpers/wire.js';

const built = isBuilt();
const isRoot = process.getuid?.() === 0;
let b: Battery;
let atk: Attackers;
let fake: FakeController;
let v1: AgentProc;
let marker: string;
let gen = 1_000;
/** The answer the victim got at start, for the replay. */
let initial: MetadataAnswer;

beforeAll(async () => {
  if (!built) return;
  b = await Battery.create();
  atk = new Attackers(b);
  await b.issue('controller', 'c2');
  await b.issue('controller', 'c9');
  await b.issue('agent', 'n2');
  marker = path.join(b.work, 'PWNED');
  fake = await new FakeController(b.cred('controller', 'controller')).listen();
  fake.answer = ({ nonce }) => (initial = signed200({ nonce, gen: 1, items: [] }));
  v1 = await b.startAgent('v1', { controllerUrl: fake.url });
  await b.startController();
  await b.startAgent('h1');
  await waitFor('the victim to apply its first metadata', () => appliedGeneration(v1) === 1, 20_000, 50);
  await b.quiesce(3_000); // past any start-up poll retry (a first retry comes within 1 s)
}, 120_000);

afterAll(async () => {
  closeAllWs();
  await fake?.close();
  await b?.close();
});

function appliedGeneration(a: AgentProc): number | undefined {
  try {
    return AgentState.read(a.state).lastAppliedGeneration;
  } catch {
    return undefined; // a snapshot being replaced this instant: asked again
  }
}

const CTL = (): string => b.spiffe('controller', 'controller');
const V1 = (): string => b.spiffe('agent', 'v1');

/** A deployment item that, if it ever ran, would leave the marker file. */
function evil(tag: string, over: Partial<MetadataItem> = {}): MetadataItem {
  return {
    id: `evil-${tag}-${crypto.randomBytes(4).toString('hex')}`,
    name: `evil-${tag}`,
    group: 'script',
    creation_time: new Date().toISOString(),
    config: `#!/bin/sh\necho ${tag} >> ${marker}\n`,
    inputs: [],
    outputs: [],
    options: {},
    deployment_id: `d-${tag}`,
    revision: 1,
    signalled: false,
    ...over,
  };
}

interface SignOpts {
  nonce: string | undefined;
  gen: number;
  items?: MetadataItem[];
  node?: string;
  signer?: Signer;
  aud?: string;
  iss?: string;
  /** Sign this body, send another. */
  sent?: (body: Buffer) => Buffer;
}

/** A 200 as the controller answers it: the body's digest signed with the request's nonce. */
function signed200(o: SignOpts): MetadataAnswer {
  const body = Buffer.from(JSON.stringify({ node: o.node ?? 'v1', generation: o.gen, deployments: o.items ?? [] }));
  const sig = signMetadata(o.signer ?? b.signer, {
    iss: o.iss ?? CTL(),
    aud: o.aud ?? V1(),
    gen: o.gen,
    nonce: o.nonce,
    sha256: sha256b64url(body),
    nowS: Date.now() / 1000,
  });
  return { status: 200, headers: { etag: `"${o.gen}"`, 'herald-signature': sig }, body: o.sent ? o.sent(body) : body };
}

/** A 304 with a signature. */
function signed304(o: SignOpts & { sha256?: string }): MetadataAnswer {
  const sig = signMetadata(o.signer ?? b.signer, {
    iss: CTL(),
    aud: V1(),
    gen: o.gen,
    nonce: o.nonce,
    sha256: o.sha256,
    nowS: Date.now() / 1000,
  });
  return { status: 304, headers: { etag: `"${o.gen}"`, 'herald-signature': sig } };
}

/** Wakes `a` with a valid wake-up from controller/c2 for a generation it has not fetched. */
async function wake(a: AgentProc): Promise<void> {
  const c = await openWs(a.port, b.cred('controller', 'c2'));
  const answer = await ask(
    c,
    validWake(b.signerOf('c2'), b.spiffe('controller', 'c2'), b.spiffe('agent', a.node), ++gen),
  );
  expect(answer.type).toBe('ack');
  c.ws.terminate();
}

/** The next `metadata fetch failed` line of `a` after line `from`. */
async function nextFetchFailure(a: AgentProc, from: number): Promise<Record<string, unknown>> {
  return waitFor(
    `agent ${a.node} to refuse the fetch`,
    () =>
      a
        .lines()
        .slice(from)
        .find((l) => l.msg === 'metadata fetch failed'),
    10_000,
    20,
  );
}

describe.skipIf(!built)('agent side: metadata the agent refuses', () => {
  // each: [title, the fake controller's answer to the next fetch, the refusal code]
  const cases: Array<[string, (nonce: string) => MetadataAnswer, string]> = [
    [
      'a metadata body altered in transit',
      (nonce) =>
        signed200({
          nonce,
          gen: 50,
          items: [evil('altered', { config: '#!/bin/sh\ntrue\n' })],
          sent: (body) =>
            Buffer.from(body.toString().replace('#!/bin/sh\\ntrue\\n', `#!/bin/sh\\necho altered >> ${marker}\\n`)),
        }),
      'digest_mismatch',
    ],
    [
      'metadata signed with a key the agent does not trust',
      (nonce) => signed200({ nonce, gen: 50, items: [evil('untrusted')], signer: new Signer(newSigningJwk()) }),
      'unknown_kid',
    ],
    [
      'metadata signed by another key under the trusted kid',
      (nonce) =>
        signed200({
          nonce,
          gen: 50,
          items: [evil('forged-kid')],
          signer: new Signer({ ...newSigningJwk(), kid: b.signingJwk.kid }),
        }),
      'bad_signature',
    ],
    ['a replayed older signed response', () => initial, 'nonce_mismatch'],
    [
      'a captured response with work in it, signed for another request',
      () => signed200({ nonce: newNonce(), gen: 50, items: [evil('captured')] }),
      'nonce_mismatch',
    ],
    [
      'a response signed without a nonce',
      () => signed200({ nonce: undefined, gen: 50, items: [evil('no-nonce')] }),
      'nonce_mismatch',
    ],
    ['a 304 with a signature for another nonce', () => signed304({ nonce: newNonce(), gen: 1 }), 'nonce_mismatch'],
    [
      "a 304 carrying a 200's signature",
      (nonce) => signed304({ nonce, gen: 1, sha256: sha256b64url('{}') }),
      'bad_response',
    ],
    [
      'a signature for another node',
      (nonce) => signed200({ nonce, gen: 50, items: [evil('other-aud')], aud: b.spiffe('agent', 'n2') }),
      'wrong_audience',
    ],
    [
      "another node's metadata under this node's signature",
      (nonce) => signed200({ nonce, gen: 50, items: [evil('other-node')], node: 'n2' }),
      'bad_response',
    ],
    [
      'a signature naming another controller as issuer',
      (nonce) => signed200({ nonce, gen: 50, items: [evil('other-iss')], iss: b.spiffe('controller', 'c2') }),
      'wrong_issuer',
    ],
    [
      'an older generation than the one applied (rollback)',
      (nonce) => signed200({ nonce, gen: 0, items: [evil('rollback')] }),
      'rollback',
    ],
    [
      'a body whose generation is not the signed one',
      (nonce) => {
        const body = JSON.stringify({ node: 'v1', generation: 51, deployments: [evil('gen')] });
        const sig = signMetadata(b.signer, {
          iss: CTL(),
          aud: V1(),
          gen: 50,
          nonce,
          sha256: sha256b64url(body),
          nowS: Date.now() / 1000,
        });
        return { status: 200, headers: { etag: '"50"', 'herald-signature': sig }, body };
      },
      'bad_response',
    ],
    [
      'a response without a signature',
      () => ({ status: 200, body: JSON.stringify({ node: 'v1', generation: 50, deployments: [evil('unsigned')] }) }),
      'missing_signature',
    ],
    [
      'a wake-up token as the metadata signature',
      () => ({
        status: 200,
        headers: { 'herald-signature': validWake(b.signer, CTL(), V1(), 50) },
        body: JSON.stringify({ node: 'v1', generation: 50, deployments: [evil('wake-typ')] }),
      }),
      'wrong_type',
    ],
    [
      'a metadata response over 16 MiB',
      (nonce) =>
        signed200({
          nonce,
          gen: 50,
          items: [evil('huge', { config: `#!/bin/sh\n#${'x'.repeat(17 * 1024 * 1024)}\necho huge >> ${marker}\n` })],
        }),
      'response_too_large',
    ],
  ];

  it.each(cases)('%s', async (_title, answer, code) => {
    const before = snapshotDir(v1.state);
    const from = v1.lines().length;
    const fetches = fake.metadataRequests;
    const signals = fake.signals.length;
    fake.answer = ({ nonce }) => answer(nonce);
    await wake(v1);
    const line = await nextFetchFailure(v1, from);
    await sleep(SETTLE_MS);
    expect(line.code).toBe(code);
    expect(fake.metadataRequests).toBe(fetches + 1);
    expect(snapshotDir(v1.state)).toEqual(before);
    assertNoWork(v1.state);
    expect(fake.signals.length).toBe(signals);
    expect(fs.existsSync(marker)).toBe(false);
  });
});

describe.skipIf(!built)('agent side: names checked again before anything runs', () => {
  // correctly signed items a compromised controller store could serve; each fails without running
  const cases: Array<[string, () => MetadataItem, string]> = [
    [
      'an input named LD_PRELOAD in signed metadata',
      () => evil('ld-preload', { inputs: [{ name: 'LD_PRELOAD', type: 'String', value: '/tmp/evil.so' }] }),
      'forbidden_input',
    ],
    ['a group "../../bin/sh" in signed metadata', () => evil('group', { group: '../../bin/sh' }), 'bad_name'],
    [
      'a component tool "../x" in signed metadata',
      () =>
        evil('tool', {
          group: 'component',
          config: { configs: [{ actions: ['CREATE'], tool: '../x', config: `echo tool >> ${marker}` }] },
          inputs: [{ name: 'deploy_action', type: 'String', value: 'CREATE' }],
        }),
      'bad_name',
    ],
    [
      'an output named "../../etc/shadow" in signed metadata',
      () => evil('output', { outputs: [{ name: '../../etc/shadow', type: 'String', error_output: false }] }),
      'bad_name',
    ],
  ];

  it.each(cases)('%s', async (_title, item, code) => {
    const it1 = item();
    const signals = fake.signals.length;
    fake.answer = ({ nonce }) => signed200({ nonce, gen: ++gen, items: [it1] });
    await wake(v1);
    await waitFor('the refusal to be signalled', () => fake.signals.length > signals, 10_000, 20);
    const s = fake.signals[signals]!.body as { deploy_status_code: number; status_reason: string };
    expect(s.deploy_status_code).toBe(-1);
    expect(s.status_reason.split(':')[0]).toBe(code);
    expect(fs.existsSync(marker)).toBe(false);
    // the refusal was signalled (and leaves the outbox once the controller took it); no run dir
    await waitFor('the outbox to drain', () => fs.readdirSync(path.join(v1.state, 'outbox')).length === 0, 5_000, 20);
    assertNoWork(v1.state);
  });

  it('control: the same kind of item, correctly signed and named, does run', async () => {
    const signals = fake.signals.length;
    fake.answer = ({ nonce }) => signed200({ nonce, gen: ++gen, items: [evil('control')] });
    await wake(v1);
    await waitFor('the control item to be signalled', () => fake.signals.length > signals, 10_000, 20);
    expect(fs.readFileSync(marker, 'utf8')).toBe('control\n');
    fs.rmSync(marker);
  });

  it("a hidden input value reaches neither the agent's log, nor its state dir, nor an undelivered signal in its outbox", async () => {
    const secret = `s3cr3t-${crypto.randomBytes(8).toString('hex')}`;
    const signals = fake.signals.length;
    fake.signalStatus = 503;
    const item = evil('hidden', {
      config: '#!/bin/sh\ntest -n "$db_password" && echo "password set"\n',
      inputs: [{ name: 'db_password', type: 'String', value: secret }],
    });
    fake.answer = ({ nonce }) => signed200({ nonce, gen: ++gen, items: [item] });
    await wake(v1);
    await waitFor('the signal to be tried and refused', () => fake.signals.length > signals, 10_000, 20);
    await sleep(200);
    const outbox = fs.readdirSync(path.join(v1.state, 'outbox')).filter((f) => f.endsWith('.json'));
    expect(outbox.length).toBeGreaterThanOrEqual(1);
    expect(JSON.stringify(fake.signals[signals]!.body)).toContain('password set');
    expect(grepDir(v1.state, secret)).toEqual([]);
    expect(v1.proc.log()).not.toContain(secret);
    expect(JSON.stringify(fake.signals.slice(signals))).not.toContain(secret);
    // the controller is back: the outbox delivers and empties
    fake.signalStatus = 200;
    await waitFor('the outbox to drain', () => fs.readdirSync(path.join(v1.state, 'outbox')).length === 0, 15_000, 50);
  });
});

describe.skipIf(!built)("agent side: a wake-up's gen is a hint", () => {
  it('a wake-up claiming gen 2^53-1 does not mute push: the next real wake-up is fetched and its work runs', async () => {
    const real = ++gen;
    const fetches = fake.metadataRequests;
    fake.answer = ({ nonce }) => signed200({ nonce, gen: real, items: [] });
    const c = await openWs(v1.port, b.cred('controller', 'c2'));
    expect(
      await ask(c, validWake(b.signerOf('c2'), b.spiffe('controller', 'c2'), V1(), Number.MAX_SAFE_INTEGER)),
    ).toMatchObject({ type: 'ack', fetch: 'started' });
    await waitFor('the fetch the false claim caused', () => fake.metadataRequests > fetches, 10_000, 20);
    await sleep(SETTLE_MS);
    // a real change: the controller's next generation, with work in it
    const next = ++gen;
    const signals = fake.signals.length;
    fake.answer = ({ nonce }) => signed200({ nonce, gen: next, items: [evil('after-max')] });
    const a = await ask(c, validWake(b.signerOf('c2'), b.spiffe('controller', 'c2'), V1(), next));
    expect(a).toMatchObject({ type: 'ack', fetch: 'started', gen: real });
    await waitFor('the real change to be applied and signalled', () => fake.signals.length > signals, 10_000, 20);
    expect(fs.readFileSync(marker, 'utf8')).toBe('after-max\n');
    fs.rmSync(marker);
    c.ws.terminate();
  });
});

describe.skipIf(!built)('agent side: a controller API impersonated', () => {
  let imp: AgentProc;
  let impostor: FakeController;

  beforeAll(async () => {
    impostor = await new FakeController(b.cred('agent', 'n2')).listen();
    imp = await b.startAgent('imp', { controllerUrl: impostor.url });
  }, 60_000);
  afterAll(async () => impostor?.close());

  it('the endpoint announcement to an impostor is refused before any request', async () => {
    const announce = await waitFor(
      'an announcement to be refused',
      () => {
        const lines = imp.lines().filter((l) => l.msg === 'endpoint announcement failed; retrying');
        return lines.length > 0 ? lines : null;
      },
      10_000,
      20,
    );
    expect(announce[0]!.code).toBe('wrong_peer');
    expect(imp.lines().some((l) => l.msg === 'endpoint announced')).toBe(false);
    expect(impostor.requests).toEqual([]);
  });

  // each: [title, the impostor's certificate, the code the agent logs]
  const cases: Array<[string, () => Cred, string]> = [
    ['a controller API served with a valid agent certificate (agent/n2)', () => b.cred('agent', 'n2'), 'wrong_peer'],
    [
      'a controller API served with the certificate of a controller outside --controller-id (controller/c9)',
      () => b.cred('controller', 'c9'),
      'wrong_peer',
    ],
    [
      'a controller API served with controller/controller from a foreign CA',
      () => atk.foreign('controller', 'controller'),
      'untrusted_certificate',
    ],
    [
      'a controller API served with an expired controller/controller certificate',
      () => atk.expired('controller', 'controller'),
      'certificate_expired',
    ],
    [
      'a controller API served with a self-signed controller/controller',
      () => atk.forged('controller', 'controller'),
      'untrusted_certificate',
    ],
  ];

  it.each(cases)('%s', async (_title, cred, code) => {
    await impostor.close();
    await impostor.listen(cred());
    await sleep(100);
    const before = snapshotDir(imp.state);
    const from = imp.lines().length;
    const tlsBefore = impostor.tlsConnections;
    await wake(imp);
    // (a retry that hit the port while the impostor was being swapped says ECONNREFUSED: not ours)
    const line = await waitFor(
      'the agent to refuse the impostor',
      () =>
        imp
          .lines()
          .slice(from)
          .find((l) => l.msg === 'metadata fetch failed' && l.code !== 'ECONNREFUSED'),
      10_000,
      20,
    );
    expect(line.code).toBe(code);
    // the agent never sent a request: not its nonce, not its node's path, nothing
    expect(impostor.requests).toEqual([]);
    expect(impostor.tlsConnections).toBeGreaterThanOrEqual(tlsBefore);
    expect(snapshotDir(imp.state)).toEqual(before);
    assertNoWork(imp.state);
  });
});

describe.skipIf(!built)('agent side: hooks and outputs', () => {
  let h1: AgentProc;
  const secretFile = (): string => path.join(b.work, 'secret.txt');

  beforeAll(() => {
    h1 = b.agent('h1');
    fs.writeFileSync(secretFile(), 'TOPSECRET root-only file\n', { mode: 0o600 });
  });

  async function deploy(
    config: Record<string, unknown>,
    values: Record<string, unknown> = {},
  ): Promise<Record<string, any>> {
    const c = await b.asOperator('POST', '/v1/configs', config);
    expect(c.status, c.raw).toBe(201);
    const d = await b.asOperator('POST', '/v1/deployments', { node: 'h1', config_id: c.json.id, input_values: values });
    expect(d.status, d.raw).toBe(201);
    return waitFor(
      'the deployment to finish',
      async () => {
        const r = await b.asOperator('GET', `/v1/deployments/${d.json.deployment_id as string}`);
        return ['COMPLETE', 'FAILED'].includes(r.json?.status) ? (r.json as Record<string, any>) : null;
      },
      20_000,
      50,
    );
  }

  // each: [title, the script, the code]
  const outputCases: Array<[string, () => string, string]> = [
    [
      'an output path replaced by a symlink to a root-only file is not followed',
      () => `#!/bin/sh\nln -s ${secretFile()} "$heat_outputs_path.result"\n`,
      'output_not_regular',
    ],
    [
      'an output path replaced by a FIFO does not hang the agent',
      () => '#!/bin/sh\nmkfifo "$heat_outputs_path.result"\n',
      'output_not_regular',
    ],
    [
      'an output file over 1 MiB is not read',
      () => '#!/bin/sh\nhead -c 1048577 /dev/zero > "$heat_outputs_path.result"\n',
      'output_too_large',
    ],
  ];

  it.each(outputCases)('%s', async (_title, script, code) => {
    const d = await deploy({ name: 'outputs', group: 'script', config: script(), outputs: [{ name: 'result' }] });
    expect(d.status).toBe('FAILED');
    expect(String(d.status_reason).split(':')[0]).toBe(code);
    expect(d.output_values.result ?? null).toBeNull();
    expect(JSON.stringify(d)).not.toContain('TOPSECRET');
  });

  describe.skipIf(!isRoot)('as root, unsafe hooks do not run', () => {
    const hook = (): string => path.join(h1.hooks, 'pwn');
    beforeAll(() => {
      fs.writeFileSync(hook(), `#!/bin/sh\necho hook >> ${marker}\necho '{"deploy_status_code":0}'\n`, { mode: 0o755 });
    });

    // each: [title, make it unsafe, undo]
    const cases: Array<[string, () => void, () => void]> = [
      ['a group-writable hooks dir', () => fs.chmodSync(h1.hooks, 0o775), () => fs.chmodSync(h1.hooks, 0o755)],
      ['a world-writable hook', () => fs.chmodSync(hook(), 0o757), () => fs.chmodSync(hook(), 0o755)],
      ['a hook owned by another user', () => fs.chownSync(hook(), 65534, 0), () => fs.chownSync(hook(), 0, 0)],
      [
        'a hook symlinked to a group-writable file',
        () => {
          const target = path.join(b.work, 'elsewhere', 'pwn');
          fs.mkdirSync(path.dirname(target), { recursive: true, mode: 0o775 });
          fs.chmodSync(path.dirname(target), 0o775);
          fs.renameSync(hook(), target);
          fs.symlinkSync(target, hook());
        },
        () => {
          const target = path.join(b.work, 'elsewhere', 'pwn');
          fs.unlinkSync(hook());
          fs.renameSync(target, hook());
        },
      ],
    ];

    it.each(cases)('%s', async (_title, unsafe, undo) => {
      unsafe();
      try {
        const d = await deploy({ name: 'pwn', group: 'pwn', config: 'x' });
        expect(d.status).toBe('FAILED');
        expect(String(d.status_reason).split(':')[0]).toBe('unsafe_hooks_dir');
        expect(fs.existsSync(marker)).toBe(false);
      } finally {
        undo();
      }
    });

    it('control: a root-owned 0755 hook in a 0755 dir runs', async () => {
      const d = await deploy({ name: 'pwn', group: 'pwn', config: 'x' });
      expect(d.status, d.status_reason).toBe('COMPLETE');
      expect(fs.readFileSync(marker, 'utf8')).toBe('hook\n');
      fs.rmSync(marker);
    });
  });

  it('a hidden value a hook prints to stdout and stderr is signalled as *** (the hook ran with the real value)', async () => {
    const secret = `pr1nted-${crypto.randomBytes(8).toString('hex')}`;
    const d = await deploy(
      {
        name: 'printed',
        group: 'script',
        outputs: [{ name: 'echo' }],
        config:
          '#!/bin/sh\necho "pw=$db_password"\necho "err=$db_password" >&2\nprintf "%s" "$db_password" | wc -c\nprintf "out=%s" "$db_password" > "$heat_outputs_path.echo"\n',
        inputs: [{ name: 'db_password', hidden: true }],
      },
      { db_password: secret },
    );
    expect(d.status, d.status_reason).toBe('COMPLETE');
    // the hook saw the value (its length), the signal carries only the mask
    expect(d.output_values.deploy_stdout).toBe(`pw=***\n${secret.length}\n`);
    expect(d.output_values.deploy_stderr).toBe('err=***\n');
    expect(d.output_values.echo).toBe('out=***');
    expect(h1.proc.log()).not.toContain(secret);
    expect(grepDir(h1.state, secret)).toEqual([]);
  });

  it('a hidden input is absent from logs, events, API responses, outbox and state dir', async () => {
    const secret = `hunter2-${crypto.randomBytes(8).toString('hex')}`;
    const secretDefault = `default-${crypto.randomBytes(8).toString('hex')}`;
    const events = sse(b);
    await sleep(300);
    const d = await deploy(
      {
        name: 'hidden',
        group: 'script',
        config: '#!/bin/sh\ntest -n "$db_password" && test -n "$api_token" && echo "both set"\n',
        inputs: [
          { name: 'db_password', hidden: true },
          { name: 'api_token', hidden: true, default: secretDefault },
        ],
      },
      { db_password: secret },
    );
    expect(d.status, d.status_reason).toBe('COMPLETE');
    expect(d.output_values.deploy_stdout).toContain('both set');
    expect(d.input_values.db_password).toBe('***');
    await sleep(500);
    const seen = events.text();
    events.close();
    const id = d.deployment_id as string;
    const api = await Promise.all(
      [
        `/v1/deployments/${id}`,
        `/v1/deployments/${id}/revisions`,
        '/v1/deployments',
        '/v1/deployments?node=h1',
        `/v1/configs/${d.config_id as string}`,
        '/v1/configs',
        '/v1/nodes/h1',
        '/v1/audit?limit=1000',
        '/metrics',
      ].map(async (p) => (await b.asOperator('GET', p)).raw),
    );
    expect(seen).toContain(id);
    for (const s of [secret, secretDefault]) {
      expect(seen).not.toContain(s);
      for (const body of api) expect(body).not.toContain(s);
      expect(b.ctl.proc.log()).not.toContain(s);
      expect(h1.proc.log()).not.toContain(s);
      expect(grepDir(h1.state, s)).toEqual([]);
    }
  });
});

describe.skipIf(!built)('agent side: signing key rotation and a revoked kid', () => {
  let h1: AgentProc;
  let oldSigner: Signer;
  let newSigner: Signer;
  let oldC2: Signer;
  let newC2: Signer;
  const count = (a: AgentProc, msg: string): number => a.lines().filter((l) => l.msg === msg).length;

  beforeAll(async () => {
    h1 = b.agent('h1');
    oldSigner = b.signer;
    oldC2 = b.signerOf('c2');
    const before = [count(h1, 'JWKS reloaded'), count(v1, 'JWKS reloaded')];
    // the first controller's key (the real controller signs with it) and c2's (its wake-ups)
    await rotateSigningKey({ dir: b.pkiDir, controller: 'c2' });
    await rotateSigningKey({ dir: b.pkiDir });
    newSigner = new Signer(JSON.parse(fs.readFileSync(pkiPaths(b.pkiDir).signingJwk, 'utf8')) as Ed25519PrivateJwk);
    newC2 = b.signerOf('c2');
    await waitFor(
      'the agents to re-read the JWKS',
      () => count(h1, 'JWKS reloaded') > before[0]! && count(v1, 'JWKS reloaded') > before[1]!,
      10_000,
      50,
    );
    await b.quiesce();
  }, 60_000);

  it('control: during a rotation both kids are trusted, and the controller signs with the new one', async () => {
    const c = await openWs(h1.port, b.cred('controller', 'c2'));
    for (const signer of [oldC2, newC2]) {
      expect(await ask(c, validWake(signer, b.spiffe('controller', 'c2'), b.spiffe('agent', 'h1'), 0))).toMatchObject({
        type: 'ack',
        fetch: 'current',
      });
    }
    c.ws.terminate();
    // the controller took the new key with the new JWKS: its metadata signatures name the new kid
    const kidOf = async (): Promise<string | undefined> => {
      const r = await api(b.ctl.port, b.cred('agent', 'h1'), 'GET', '/v1/nodes/h1/metadata', undefined, {
        'herald-nonce': newNonce(),
      });
      const sig = String(r.headers['herald-signature'] ?? '');
      return (JSON.parse(Buffer.from(sig.split('.')[0] ?? '', 'base64url').toString() || '{}') as { kid?: string }).kid;
    };
    expect(await kidOf()).toBe(newSigner.kid);
    const cfg = await b.asOperator('POST', '/v1/configs', {
      name: 'after-rotation',
      group: 'script',
      config: '#!/bin/sh\necho rotated\n',
    });
    const d = await b.asOperator('POST', '/v1/deployments', { node: 'h1', config_id: cfg.json.id });
    await waitFor(
      'a deployment after the rotation to complete',
      async () =>
        (await b.asOperator('GET', `/v1/deployments/${d.json.deployment_id as string}`)).json?.status === 'COMPLETE',
      15_000,
      50,
    );
  });

  it('a wake-up signed with a revoked kid is nack unknown_kid', async () => {
    const before = count(h1, 'revoked.json reloaded');
    await revoke({ dir: b.pkiDir, kid: oldSigner.kid });
    await revoke({ dir: b.pkiDir, kid: oldC2.kid });
    await waitFor('the agent to re-read revoked.json', () => count(h1, 'revoked.json reloaded') > before, 10_000, 50);
    await b.quiesce();
    const c = await openWs(h1.port, b.cred('controller', 'c2'));
    const a = await b.expectNoEffect(['h1'], () =>
      ask(c, validWake(oldC2, b.spiffe('controller', 'c2'), b.spiffe('agent', 'h1'), 1_000_000)),
    );
    expect(a).toMatchObject({ type: 'nack', error: 'unknown_kid' });
    c.ws.terminate();
  });

  it('metadata signed with a revoked kid is refused with unknown_kid', async () => {
    await waitFor(
      'the victim to re-read revoked.json',
      () => v1.lines().some((l) => l.msg === 'revoked.json reloaded'),
      10_000,
      50,
    );
    const before = snapshotDir(v1.state);
    const from = v1.lines().length;
    fake.answer = ({ nonce }) => signed200({ nonce, gen: ++gen, items: [evil('revoked-kid')], signer: oldSigner });
    const c = await openWs(v1.port, b.cred('controller', 'c2'));
    expect(await ask(c, validWake(newC2, b.spiffe('controller', 'c2'), V1(), ++gen))).toMatchObject({
      type: 'ack',
    });
    c.ws.terminate();
    const line = await nextFetchFailure(v1, from);
    await sleep(SETTLE_MS);
    expect(line.code).toBe('unknown_kid');
    expect(snapshotDir(v1.state)).toEqual(before);
    expect(fs.existsSync(marker)).toBe(false);
  });
});

describe.skipIf(!built)('agent side: a corrupt revoked.json', () => {
  let h1: AgentProc;
  const revokedPath = (): string => path.join(b.pkiDir, 'revoked.json');
  let good: string;

  beforeAll(async () => {
    h1 = b.agent('h1');
    await b.issue('controller', 'rv');
    await b.issue('operator', 'rv-op');
    await b.revoke('controller', 'rv');
    await b.revoke('operator', 'rv-op');
    await waitFor(
      'the agent to refuse the revoked controller',
      async () => {
        const r = await rawUpgrade(h1.port, b.cred('controller', 'rv'));
        return r.kind === 'http' && r.code === 'revoked';
      },
      10_000,
      50,
    );
    await waitFor(
      'the controller to refuse the revoked operator',
      async () => (await operatorCall('rv-op')).code === 'revoked',
      10_000,
      50,
    );
    good = fs.readFileSync(revokedPath(), 'utf8');
    const loadErrors = (t: string): number =>
      jsonLines(t).filter((l) => String(l.msg).startsWith('PKI file not loaded')).length;
    const agentErrors = loadErrors(h1.proc.log());
    const controllerErrors = loadErrors(b.ctl.proc.log());
    fs.writeFileSync(revokedPath(), '{"serials": [ this is not JSON');
    await waitFor(
      'the agent and the controller to refuse the corrupt file',
      () => loadErrors(h1.proc.log()) > agentErrors && loadErrors(b.ctl.proc.log()) > controllerErrors,
      10_000,
      50,
    );
    await b.quiesce();
  }, 60_000);

  afterAll(() => {
    if (good !== undefined) fs.writeFileSync(revokedPath(), good);
  });

  it('the agent keeps the last good list: a revoked controller is still 403 revoked', async () => {
    const r = await b.expectNoEffect(['h1'], () => rawUpgrade(h1.port, b.cred('controller', 'rv')));
    expect(r).toMatchObject({ kind: 'http', status: 403, code: 'revoked' });
    // and it did not fall back to an empty list nor refuse everyone
    const ok = await openWs(h1.port, b.cred('controller', 'c2'));
    ok.ws.terminate();
  });

  it('the controller keeps the last good list: a revoked operator is still 403 revoked', async () => {
    const r = await b.expectNoEffect(['h1'], () => operatorCall('rv-op'));
    expect(r).toEqual({ status: 403, code: 'revoked' });
  });
});

describe.skipIf(!built)('agent side: teardown', () => {
  it('leaves no process, socket or temp file behind', async () => {
    closeAllWs();
    await fake.close();
    await b.close();
    expect(await b.leftovers()).toEqual([]);
  });
});

/** GET /v1/nodes as `operator/<name>`: the status and error code. */
function operatorCall(name: string): Promise<{ status: number; code: string | undefined }> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port: b.ctl.port,
        path: '/v1/nodes',
        ...b.cred('operator', name),
        checkServerIdentity: () => undefined,
      },
      (res) => {
        let t = '';
        res.on('data', (d: Buffer) => (t += d.toString()));
        res.on('end', () => {
          let code: string | undefined;
          try {
            code = (JSON.parse(t) as { error?: { code?: string } }).error?.code;
          } catch {
            code = undefined;
          }
          resolve({ status: res.statusCode ?? 0, code });
        });
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** Files under `dir` whose content holds `needle`. */
function grepDir(dir: string, needle: string): string[] {
  const hits: string[] = [];
  for (const [rel, kind] of Object.entries(snapshotDir(dir))) {
    if (kind === 'dir' || kind.startsWith('link')) continue;
    if (fs.readFileSync(path.join(dir, rel)).includes(needle)) hits.push(rel);
  }
  return hits;
}

/** Collects the controller's event stream as the operator. */
function sse(bat: Battery): { text(): string; close(): void } {
  let buf = '';
  const req = https.request(
    { host: '127.0.0.1', port: bat.ctl.port, path: '/v1/events', ...bat.op, checkServerIdentity: () => undefined },
    (res) => {
      res.on('data', (d: Buffer) => (buf += d.toString()));
      res.on('error', () => undefined);
    },
  );
  req.on('error', () => undefined);
  req.end();
  return { text: () => buf, close: () => req.destroy() };
}
