/**
 * The agent's own wake-up listener (`agent/listener.ts`) for the controller's push tests, with
 * the agent's own fetch coalescer behind it: TLS 1.3 mutual auth, a controller authorized
 * before the upgrade (403 + code otherwise), wake-ups verified by `WakeVerifier`, each answered
 * with an ack or a nack, all by the real code. Only the metadata fetch is fake (the smallest
 * interface behind the coalescer): the controller is taken to serve, in no time, the newest
 * generation a wake-up named, so an ack already carries the gen of the wake-up that started or
 * queued the fetch (`fetch` says which), as if fetched at once.
 *
 * Faults the dialer must survive: `silent` puts a TCP relay in front of the listener that passes
 * the TLS handshake and the upgrade and then drops everything the agent sends (no ack, no pong:
 * a half-open peer); `stop()`/`listen()` take the port down and up again.
 */
import type { SignalledFrame } from '../../protocol/frames.js';
import { EventEmitter, once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pino, { type Logger } from 'pino';
import { materialPaths, pkiPaths } from '../../certs/paths.js';
import { initPki, issueCert } from '../../certs/pki.js';
import { PkiMaterial } from '../../certs/tls.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import { Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import { WakeVerifier, type WakeClaims } from '../../protocol/wake.js';
import { FetchCoalescer } from '../../agent/coalescer.js';
import { keySetOf } from '../../agent/fetcher.js';
import { WakeListener, type PushFetchAnswer } from '../../agent/listener.js';

export type ListenerMode = 'answer' | 'silent';

export interface TestWakeListenerOptions {
  pkiDir: string;
  trustDomain?: string;
  /** The node this listener serves: the wake-ups' audience. */
  node: string;
  /** Present the certificate `agent/<certName>` (default `node`): another name tests wrong_peer. */
  certName?: string;
  mode?: ListenerMode;
  /** 0 (default) picks a free port; give the old port to come back after stop(). */
  port?: number;
}

export interface ReceivedWake {
  claims: WakeClaims;
  /** The `kid` that signed it. */
  kid: string;
  at: number;
}

/** The real verifier; it only notes the `kid` of the last token it accepted. */
class KidNotingVerifier extends WakeVerifier {
  lastKid = '';
  override verify(frame: string, peerSpiffeId: string): WakeClaims {
    const claims = super.verify(frame, peerSpiffeId);
    this.lastKid = (JSON.parse(Buffer.from(frame.split('.')[0]!, 'base64url').toString()) as { kid: string }).kid;
    return claims;
  }
}

const quietLog = pino({ level: process.env.HERALD_TEST_LOG ?? 'silent' });

/**
 * Events: 'wake' (ReceivedWake, after its ack was written), 'nack' (code), 'connection' (),
 * 'close' (the close code the listener saw), 'refused' (code of any other refusal).
 */
export class TestWakeListener extends EventEmitter {
  readonly node: string;
  readonly material: PkiMaterial;
  /** Verified wake-ups (in `silent` mode too: the listener answers them, the relay drops it). */
  readonly wakes: ReceivedWake[] = [];
  readonly nacks: string[] = [];
  readonly closeCodes: number[] = [];
  readonly refusals: string[] = [];
  /** Codes of the refusals of upgrades made on a resumed TLS session. */
  readonly resumedRefusals: string[] = [];
  /** Authenticated WebSocket connections accepted so far. */
  connections = 0;
  /** For each accepted connection, in order: whether its TLS session was resumed. */
  readonly resumed: boolean[] = [];
  readonly mode: ListenerMode;
  port: number;
  readonly #verifier: KidNotingVerifier;
  readonly #coalescer: FetchCoalescer;
  /** The generation the fake controller serves: the newest a verified wake-up named. */
  #served = 0;
  #listener: WakeListener | null = null;
  #relay: net.Server | null = null;
  readonly #relayed = new Set<net.Socket>();

  private constructor(opts: TestWakeListenerOptions) {
    super();
    const td = opts.trustDomain ?? 'herald.local';
    this.node = opts.node;
    this.mode = opts.mode ?? 'answer';
    this.port = opts.port ?? 0;
    this.material = new PkiMaterial({
      ...materialPaths(opts.pkiDir, 'agent', opts.certName ?? opts.node),
      trustDomain: td,
      watch: false,
    });
    this.#verifier = new KidNotingVerifier({
      audience: spiffeIdOf(td, 'agent', opts.node),
      keys: keySetOf(this.material),
      startedAtS: Date.now() / 1000,
    });
    this.#coalescer = new FetchCoalescer({ fetch: () => Promise.resolve({ gen: this.#served }) });
  }

  static async start(opts: TestWakeListenerOptions): Promise<TestWakeListener> {
    const l = new TestWakeListener(opts);
    await l.listen();
    return l;
  }

  get url(): string {
    return `wss://127.0.0.1:${this.port}/v1/wake`;
  }

  /** Starts listening (again, on the same port after stop()): a new agent listener each time. */
  async listen(): Promise<void> {
    const coalescer = this.#coalescer;
    const listener = new WakeListener({
      material: this.material,
      verifier: this.#verifier,
      onWake: (claims) => {
        if (claims.gen > this.#served) this.#served = claims.gen;
        const w: ReceivedWake = { claims, kid: this.#verifier.lastKid, at: Date.now() };
        this.wakes.push(w);
        queueMicrotask(() => this.emit('wake', w));
        return coalescer.wake(claims.gen);
      },
      // a fetch started or queued by a wake-up sees #served (see the note at the top)
      lastFetchedGen: () => (coalescer.busy ? this.#served : coalescer.lastFetchedGen),
      log: quietLog,
    });
    let nacksSeen = 0;
    listener.on('connected', ({ resumed }: { resumed: boolean }) => {
      this.resumed.push(resumed);
      this.connections++;
      this.emit('connection');
    });
    listener.on('disconnected', ({ code }: { code: number }) => {
      this.closeCodes.push(code);
      this.emit('close', code);
    });
    listener.on('refused', ({ code, resumed }: { code: string; resumed?: boolean }) => {
      if (resumed) this.resumedRefusals.push(code);
      // a nack is counted before it is reported; every other refusal leaves the count alone
      if (listener.stats.nacks > nacksSeen) {
        nacksSeen = listener.stats.nacks;
        this.nacks.push(code);
        this.emit('nack', code);
      } else {
        this.refusals.push(code);
        this.emit('refused', code);
      }
    });
    if (this.mode === 'answer') {
      this.port = await listener.listen('127.0.0.1', this.port);
    } else {
      const upstream = await listener.listen('127.0.0.1', 0);
      this.#relay = this.#startRelay(upstream);
      this.#relay.listen(this.port, '127.0.0.1');
      await once(this.#relay, 'listening');
      this.port = (this.#relay.address() as net.AddressInfo).port;
    }
    this.#listener = listener;
  }

  /**
   * Passes bytes both ways until the listener has accepted the upgrade and the dialer then sends
   * its first frame (so it has read the 101); from then on what the agent sends is dropped.
   */
  #startRelay(upstream: number): net.Server {
    return net.createServer((client) => {
      const acceptedBefore = this.connections;
      let mute = false;
      const up = net.connect(upstream, '127.0.0.1');
      this.#relayed.add(client).add(up);
      client.on('data', (d) => {
        if (this.connections > acceptedBefore) mute = true;
        up.write(d);
      });
      up.on('data', (d) => {
        if (!mute) client.write(d);
      });
      const end = (): void => {
        client.destroy();
        up.destroy();
        this.#relayed.delete(client);
        this.#relayed.delete(up);
      };
      for (const s of [client, up]) {
        s.on('error', () => {});
        s.on('close', end);
      }
    });
  }

  /** The agent's fetch over the push connection (WakeListener.fetchOverPush); null when it cannot. */
  fetchOverPush(nonce: string, ifNoneMatch?: string, timeoutMs = 5_000): Promise<PushFetchAnswer> | null {
    return this.#listener?.fetchOverPush(nonce, ifNoneMatch, timeoutMs) ?? null;
  }

  /** The agent's signal over the push connection (WakeListener.signalOverPush); null when it cannot. */
  signalOverPush(nonce: string, deployment: string, body: unknown, timeoutMs = 5_000): Promise<SignalledFrame> | null {
    const bytes = Buffer.from(JSON.stringify(body));
    const revision = (body as { revision?: number } | null)?.revision ?? 0;
    return this.#listener?.signalOverPush(nonce, deployment, revision, bytes, timeoutMs) ?? null;
  }

  /** Takes the port down: the agent listener closes (1001 to every connection) and stops listening. */
  async stop(): Promise<void> {
    const listener = this.#listener;
    const relay = this.#relay;
    this.#listener = null;
    this.#relay = null;
    for (const s of this.#relayed) s.destroy();
    if (relay) await new Promise<void>((resolve) => relay.close(() => resolve()));
    await listener?.close();
  }

  async close(): Promise<void> {
    await this.stop();
    this.#coalescer.close();
    this.material.close();
  }

  /** Resolves with the first event `event` whose arguments satisfy `pred`, or rejects after `timeoutMs`. */
  waitFor<T = unknown>(event: string, pred: (arg: T) => boolean = () => true, timeoutMs = 5_000): Promise<T> {
    return waitForEvent<T>(this, event, pred, timeoutMs);
  }
}

/** The first `event` on `emitter` whose first argument satisfies `pred`, within `timeoutMs`. */
export function waitForEvent<T = unknown>(
  emitter: EventEmitter,
  event: string,
  pred: (arg: T) => boolean = () => true,
  timeoutMs = 5_000,
): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.off(event, on);
      reject(new Error(`no matching '${event}' event within ${timeoutMs} ms`));
    }, timeoutMs);
    const on = (arg: T): void => {
      if (!pred(arg)) return;
      clearTimeout(timer);
      emitter.off(event, on);
      resolve(arg);
    };
    emitter.on(event, on);
  });
}

// ---- a PKI for push tests ----------------------------------------------------------------------

/*
 * Made by `certs/` in a temporary directory: the CA, the controller's certificate and signing
 * key, and agent certificates for the nodes asked for (one RSA key shared by all of them, so a
 * test does not spend seconds making keys).
 */
export const TD = 'herald.local';
export const CONTROLLER_ID = `spiffe://${TD}/controller/controller`;

export interface PushPki {
  dir: string;
  signingJwk: Ed25519PrivateJwk;
  signer: () => Signer;
  controllerMaterial: () => PkiMaterial;
  logger: Logger;
  cleanup: () => void;
}

export async function makePushPki(nodes: string[]): Promise<PushPki> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-push-'));
  const init = await initPki({ dir, trustDomain: TD });
  const keyPem = fs.readFileSync(init.controller.keyPath, 'utf8');
  for (const n of nodes) await issueCert({ dir, role: 'agent', name: n, ip: ['127.0.0.1'], keyPem });
  const signingJwk = JSON.parse(fs.readFileSync(pkiPaths(dir).signingJwk, 'utf8')) as Ed25519PrivateJwk;
  const materials: PkiMaterial[] = [];
  return {
    dir,
    signingJwk,
    signer: () => new Signer(signingJwk),
    controllerMaterial: () => {
      const m = new PkiMaterial({ ...materialPaths(dir, 'controller', 'controller'), trustDomain: TD, watch: false });
      materials.push(m);
      return m;
    },
    logger: pino({ level: process.env.HERALD_TEST_LOG ?? 'silent' }),
    cleanup: () => {
      for (const m of materials) m.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
