/**
 * Socket-free units of the controller: endpoint checks, the rate limiter (fake clock), ETag
 * matching, input coercion, options resolution.
 */
import { describe, expect, it } from 'vitest';
import { codeOf } from '../../protocol/errors.js';
import { hostInSans, isLinkLocal, parseEndpoint } from '../../controller/service/endpoint.js';
import { RateLimiter } from '../../controller/api/rate-limit.js';
import { statusOf } from '../../controller/error-status.js';
import { etagOf, heldGenerations, matchesEtag } from '../../controller/service/agent-answers.js';
import { coerceValue, mergeInputValues } from '../../controller/service/validation.js';
import { defaultPushWorkers, parseHostPort, resolveOptions } from '../../controller/options.js';
import { planCluster } from '../../controller/clusters/plan.js';

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    return codeOf(e) ?? 'other';
  }
  return undefined;
}

describe('endpoint', () => {
  it('accepts wss://host:port/v1/wake and normalises it', () => {
    expect(parseEndpoint('wss://LOCALHOST:7443/v1/wake')).toEqual({
      url: 'wss://localhost:7443/v1/wake',
      host: 'localhost',
    });
    expect(parseEndpoint('wss://[::1]:7443/v1/wake').host).toBe('::1');
    expect(parseEndpoint('wss://2130706433:1/v1/wake').host).toBe('127.0.0.1');
  });

  it('refuses other schemes, paths, user info, queries, unspecified and link-local hosts', () => {
    for (const u of [
      'https://h:1/v1/wake',
      'wss://h:1/v1/wake/',
      'wss://u:p@h:1/v1/wake',
      'wss://h:1/v1/wake?x',
      'wss://0.0.0.0:1/v1/wake',
      'wss://[::]:1/v1/wake',
      'not a url',
    ]) {
      expect(
        code(() => parseEndpoint(u)),
        u,
      ).toBe('bad_endpoint');
    }
    for (const u of [
      'wss://169.254.169.254:1/v1/wake',
      'wss://[fe80::1]:1/v1/wake',
      'wss://[febf::1]:1/v1/wake',
      'wss://[::ffff:169.254.1.1]:1/v1/wake',
    ]) {
      expect(
        code(() => parseEndpoint(u)),
        u,
      ).toBe('link_local_endpoint');
    }
    expect(isLinkLocal('fec0::1')).toBe(false);
    expect(isLinkLocal('169.253.0.1')).toBe(false);
  });

  it('matches hosts against SANs exactly, IPs in any notation', () => {
    expect(hostInSans('127.0.0.1', ['localhost'], ['127.0.0.1'])).toBe(true);
    expect(hostInSans('::1', [], ['0:0:0:0:0:0:0:1'])).toBe(true);
    expect(hostInSans('Node.Example.', ['node.example'], [])).toBe(true);
    expect(hostInSans('a.node.example', ['*.node.example'], [])).toBe(false);
    expect(hostInSans('10.0.0.1', ['10.0.0.1'], [])).toBe(false);
  });
});

describe('rate limiter', () => {
  it('gives a burst, then the sustained rate, with Retry-After', () => {
    let now = 0;
    const r = new RateLimiter({ burst: 5, perS: 1 }, () => now);
    for (let i = 0; i < 5; i++) expect(r.take('a').ok).toBe(true);
    expect(r.take('a')).toEqual({ ok: false, retryAfterS: 1 });
    expect(r.take('b').ok).toBe(true); // per key
    now = 999;
    expect(r.take('a').ok).toBe(false);
    now = 1000;
    expect(r.take('a').ok).toBe(true);
    now = 60_000;
    for (let i = 0; i < 5; i++) expect(r.take('a').ok).toBe(true);
  });

  it('stays bounded', () => {
    const r = new RateLimiter({ burst: 2, perS: 1 }, () => 0, 100);
    for (let i = 0; i < 1000; i++) r.take(`k${i}`);
    expect(r.size).toBeLessThanOrEqual(100);
  });
});

describe('If-None-Match', () => {
  it('understands lists, weak tags and *', () => {
    expect(matchesEtag('"5"', '"5"')).toBe(true);
    expect(matchesEtag('W/"5"', '"5"')).toBe(true);
    expect(matchesEtag('"1", "5"', '"5"')).toBe(true);
    expect(matchesEtag(['"1"', 'W/"5"'], '"5"')).toBe(true);
    expect(matchesEtag('*', '"5"')).toBe(true);
    expect(matchesEtag('"55"', '"5"')).toBe(false);
    expect(matchesEtag(undefined, '"5"')).toBe(false);
  });

  it('names the generations it matches: a fetch tells the store which documents it need not read', () => {
    const headers: Array<string | string[] | undefined> = [
      undefined,
      '"5"',
      'W/"5"',
      '"1", "5"',
      ['"1"', 'W/"5"'],
      '*',
      '"0"',
      '"05"',
      '"55"',
      '"5',
      '5',
      '"-5"',
      '"5.0"',
      '"abc", W/"7" ,"9007199254740993"',
      '',
    ];
    for (const h of headers) {
      const held = heldGenerations(h);
      for (let gen = 0; gen <= 60; gen++)
        expect(held === 'all' || held.includes(gen), `${JSON.stringify(h)} ${gen}`).toBe(matchesEtag(h, etagOf(gen)));
    }
    expect(heldGenerations('*')).toBe('all');
    expect(heldGenerations('"abc", W/"7" ,"9007199254740993"')).toEqual([7]);
  });

  it('maps codes to statuses at one place', () => {
    expect([
      statusOf('invalid_request'),
      statusOf('wrong_node'),
      statusOf('not_found'),
      statusOf('stale_revision'),
      statusOf('body_too_large'),
      statusOf('unsupported_media_type'),
      statusOf('unknown_node'),
      statusOf('rate_limited'),
    ]).toEqual([400, 403, 404, 409, 413, 415, 422, 429]);
  });
});

describe('input values', () => {
  it('coerces to Heat types and names the field on refusal', () => {
    expect(coerceValue('String', 5, 'f')).toBe('5');
    expect(coerceValue('String', { a: 1 }, 'f')).toBe('{"a":1}');
    expect(coerceValue('Number', '8080', 'f')).toBe(8080);
    expect(coerceValue('Boolean', 'yes', 'f')).toBe(true);
    expect(coerceValue('CommaDelimitedList', 'a, b', 'f')).toEqual(['a', 'b']);
    expect(coerceValue('Json', '{"a":1}', 'f')).toEqual({ a: 1 });
    expect(code(() => coerceValue('Number', 'x', 'input_values.port'))).toBe('bad_input_value');
    expect(code(() => coerceValue('Boolean', 'maybe', 'f'))).toBe('bad_input_value');
    expect(mergeInputValues({ a: 1, b: 2 }, { b: null, c: 3 })).toEqual({ a: 1, c: 3 });
  });
});

describe('options', () => {
  it('resolves command line over environment over defaults and names bad options', () => {
    const o = resolveOptions(
      { pki: '/p', db: '/d' },
      { HERALD_CONTROLLER_NAME: 'ctl2', HERALD_CONTROLLER_AUTO_REGISTER: 'false', HERALD_CONTROLLER_DB: '/env' },
      2,
    );
    expect(o).toMatchObject({
      pki: '/p',
      db: '/d',
      name: 'ctl2',
      autoRegister: false,
      listen: { host: '127.0.0.1', port: 8443 },
      pushWorkers: 1,
      healthListen: null,
    });
    expect(parseHostPort('[::1]:0', 'listen')).toEqual({ host: '::1', port: 0 });
    expect(() => resolveOptions({ db: '/d' }, {})).toThrow(/--pki/);
    expect(() => resolveOptions({ pki: '/p', db: '/d', listen: '1.2.3.4:99999' }, {})).toThrow(/--listen/);
    expect(() => resolveOptions({ pki: '/p', db: '/d', name: 'Bad' }, {})).toThrow(/--name/);
    expect(() => resolveOptions({ pki: '/p', db: '/d', 'public-url': 'http://x' }, {})).toThrow(/--public-url/);
  });

  it('starts one push worker fewer than the cores, from 1 to MAX_DEFAULT_PUSH_WORKER_PROCESSES, unless told', () => {
    expect([1, 2, 3, 4, 5, 6, 16, 64].map(defaultPushWorkers)).toEqual([1, 1, 2, 3, 4, 4, 4, 4]);
    expect(defaultPushWorkers(Number.NaN)).toBe(1);
    const base = { pki: '/p', db: '/d' };
    expect(resolveOptions(base, {}, 1).pushWorkers).toBe(1);
    expect(resolveOptions(base, {}, 3).pushWorkers).toBe(2);
    expect(resolveOptions(base, {}, 32).pushWorkers).toBe(4);
    // what the operator says wins, from every source, 0 included
    expect(resolveOptions({ ...base, 'push-workers': '0' }, {}, 32).pushWorkers).toBe(0);
    expect(resolveOptions(base, { HERALD_CONTROLLER_PUSH_WORKERS: '7' }, 2).pushWorkers).toBe(7);
    expect(() => resolveOptions({ ...base, 'push-workers': '65' }, {}, 2)).toThrow(/--push-workers/);
  });

  it('--bootstrap-admin: admin unless told, a list of operator names, or none', () => {
    const base = { pki: '/p', db: '/d' };
    expect(resolveOptions(base, {}, 2).bootstrapAdmins).toEqual(['admin']);
    expect(resolveOptions({ ...base, 'bootstrap-admin': 'alice, bob,alice' }, {}, 2).bootstrapAdmins).toEqual([
      'alice',
      'bob',
    ]);
    expect(resolveOptions(base, { HERALD_CONTROLLER_BOOTSTRAP_ADMIN: 'none' }, 2).bootstrapAdmins).toEqual([]);
    expect(() => resolveOptions({ ...base, 'bootstrap-admin': 'Root' }, {}, 2)).toThrow(/--bootstrap-admin/);
  });
});

describe('cluster planner', () => {
  const n = (
    node: string,
    position: number,
    phase: 'pending' | 'uninstalling' | 'installing' | 'complete' | 'failed',
    deadline: number | null = null,
  ) => ({ node, position, phase, stepDeadlineMs: deadline, reason: phase === 'failed' ? 'boom' : null });

  it('fills a restart window in order and finishes when nothing is in flight', () => {
    expect(planCluster('restart', 2, [n('a', 0, 'pending'), n('b', 1, 'pending'), n('c', 2, 'pending')], 0)).toEqual([
      { type: 'start', node: 'a', step: 'uninstall' },
      { type: 'start', node: 'b', step: 'uninstall' },
    ]);
    expect(
      planCluster('restart', 2, [n('a', 0, 'complete'), n('b', 1, 'installing'), n('c', 2, 'pending')], 0),
    ).toEqual([{ type: 'start', node: 'c', step: 'uninstall' }]);
    expect(planCluster('restart', 2, [n('a', 0, 'complete'), n('b', 1, 'complete')], 0)).toEqual([
      { type: 'finish', status: 'RESTART_COMPLETE', reason: expect.any(String), remove: false },
    ]);
  });

  it('starts nothing after a failure and fails once in-flight nodes finish', () => {
    expect(planCluster('restart', 1, [n('a', 0, 'failed'), n('b', 1, 'pending')], 0)).toEqual([
      { type: 'finish', status: 'RESTART_FAILED', reason: 'restart failed on a: boom', remove: false },
    ]);
    expect(planCluster('restart', 2, [n('a', 0, 'failed'), n('b', 1, 'installing'), n('c', 2, 'pending')], 0)).toEqual(
      [],
    );
  });

  it('times out steps past their deadline first', () => {
    expect(planCluster('restart', 2, [n('a', 0, 'uninstalling', 100), n('b', 1, 'pending')], 100)).toEqual([
      { type: 'timeout', node: 'a' },
    ]);
    expect(planCluster('create', 2, [n('a', 0, 'installing', 100)], 99)).toEqual([]);
  });
});
