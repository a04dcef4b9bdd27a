/**
 * Heat's object store, its operations (docs/heat.md): what Herald does with what Heat and stock
 * nodes write to it. Every write is one store transaction; a node's metadata becomes that node's
 * deployments in the same transaction as the object (so the 2xx Heat gets means both are durable),
 * and the wake-ups go out after the commit as for any change. An agent's result for a deployment
 * Heat made is written, in the signal's own transaction, to the signal object Heat reads.
 */
import crypto from 'node:crypto';
import { HeraldError } from '../../protocol/errors.js';
import { DEPLOY_ACTIONS } from '../../protocol/heat.js';
import { type HeatItem, readHeatMetadata } from '../model/heat-metadata.js';
import type { ChangeSet, DeploymentRecord, NewConfig, SignalInput } from '../model/records.js';
import type { HeatLink, ObjectHead, ObjectKey, ObjectRows, StoredObject } from '../store/objects.js';
import type { Store, StoreTx } from '../store/store.js';
import { checkConfig, configCreateSchema, parseBody } from './validation.js';

/** Where an object lives in this store, read from a URL's path (`/v1/AUTH_<project>/<container>/<object>`). */
export function objectKeyOfPath(path: string): ObjectKey | undefined {
  const m = /^\/v1\/AUTH_([^/]+)\/([^/]+)\/(.+)$/.exec(path);
  return m ? { project: m[1]!, container: m[2]!, name: m[3]! } : undefined;
}

/** The object a TempURL names (its path, decoded), or undefined. */
export function objectKeyOfUrl(url: string): ObjectKey | undefined {
  try {
    return objectKeyOfPath(decodeURIComponent(new URL(url).pathname));
  } catch {
    return undefined;
  }
}

const md5 = (b: Buffer): string => crypto.createHash('md5').update(b).digest('hex');

/** The body Heat reads a result from: heat-agents' `heat-config-notify` shape. */
export function heatSignalBody(s: SignalInput): Buffer {
  return Buffer.from(
    JSON.stringify({
      ...s.outputs,
      deploy_stdout: s.deployStdout,
      deploy_stderr: s.deployStderr,
      deploy_status_code: s.deployStatusCode,
    }),
  );
}

/** Writes an agent's result where Heat reads it, when the deployment came from Heat; in the signal's transaction. */
export async function writeHeatResult(tx: StoreTx, d: DeploymentRecord, s: SignalInput, nowMs: number): Promise<void> {
  const link = await tx.objects.heatLink(d.id);
  if (!link?.signal) return;
  const body = heatSignalBody(s);
  await tx.objects.put({ ...link.signal, body, contentType: 'application/json', etag: md5(body), modifiedMs: nowMs });
}

export interface PutResult {
  etag: string;
  /** For a node's metadata: how many deployments it holds after; else null. */
  deployments: number | null;
  /** Heat deployments made, changed or removed by this write. */
  changed: number;
}

/** The items of a stored metadata object, by Heat key; an object that is not Heat's metadata has none. */
function itemIdsOf(body: Buffer | undefined): Map<string, string> {
  const out = new Map<string, string>();
  if (body?.[0] !== 0x7b) return out;
  try {
    for (const it of readHeatMetadata(JSON.parse(body.toString('utf8')))) out.set(it.key, it.id);
  } catch {
    // not Heat's metadata: a plain object
  }
  return out;
}

/**
 * The signal object an item names, when it is in `project`'s account. Herald writes to it (empties
 * it, and writes the node's results there), so one in another account is never taken: whoever
 * may write one account's metadata would otherwise empty or overwrite another account's objects.
 */
function signalKeyOf(it: HeatItem, project: string): ObjectKey | undefined {
  const k = it.signalUrl ? objectKeyOfUrl(it.signalUrl) : undefined;
  return k?.project === project ? k : undefined;
}

/** @throws HeraldError heat_metadata_invalid when an item's signal object is in another account than `project` */
function checkSignalAccounts(items: HeatItem[], project: string): void {
  for (const [i, it] of items.entries()) {
    const k = it.signalUrl ? objectKeyOfUrl(it.signalUrl) : undefined;
    if (!k || k.project === project) continue;
    const field = `deployments.${i}.inputs.deploy_signal_id`;
    throw new HeraldError(
      'heat_metadata_invalid',
      `${field}: names an object of account AUTH_${k.project}, not of this metadata's AUTH_${project}`,
      { field },
    );
  }
}

/**
 * Empties the signal objects of the items that are new or changed since `before`, so a result
 * of an earlier update is never read as this one's: Heat reads a signal object whose
 * Last-Modified (rounded up to the second) is newer than the deployment's update, and an update
 * can start within the second of the last result (docs/heat.md). Only in the written object's
 * own account (signalKeyOf).
 */
async function clearSignals(
  o: ObjectRows,
  items: HeatItem[],
  before: Map<string, string>,
  project: string,
  nowMs: number,
) {
  for (const it of items) {
    if (before.get(it.key) === it.id) continue;
    const k = signalKeyOf(it, project);
    if (!k || !(await o.head(k))) continue;
    const body = Buffer.alloc(0);
    await o.put({ ...k, body, contentType: 'application/octet-stream', etag: md5(body), modifiedMs: nowMs });
  }
}

/** The Herald config of a Heat item. @throws HeraldError heat_metadata_invalid */
function configOf(it: HeatItem, at: string): NewConfig {
  try {
    return checkConfig(
      parseBody(configCreateSchema, {
        name: it.name,
        group: it.group,
        config: it.config,
        inputs: it.inputs,
        outputs: it.outputs,
        options: it.options,
      }),
    );
  } catch (e) {
    if (!(e instanceof HeraldError)) throw e;
    const field = e.field ? `${at}.${e.field}` : at;
    throw new HeraldError('heat_metadata_invalid', `${field}: ${e.message} (${e.code})`, { field });
  }
}

const sameConfig = (a: NewConfig, b: NewConfig): boolean =>
  JSON.stringify([a.name, a.group, a.config, a.inputs, a.outputs, a.options]) ===
  JSON.stringify([b.name, b.group, b.config, b.inputs, b.outputs, b.options]);

/**
 * Makes `node`'s deployments from `source` those of `items`: an unchanged item (same id) is left
 * alone; a changed one becomes a new revision (its config unchanged) or a new deployment (its
 * config changed); a deployment whose item is gone is removed without running. Heat's own
 * `deploy_server_id`, `deploy_stack_id` and `deploy_resource_name` stay the item's.
 */
async function reconcile(
  tx: StoreTx,
  node: string,
  source: ObjectKey,
  items: HeatItem[],
  who: string,
): Promise<number> {
  const o = tx.objects;
  const links = new Map((await o.heatLinks(node, sourceOf(source))).map((l) => [l.heatKey, l]));
  let changed = 0;
  for (const [i, it] of items.entries()) {
    const link = links.get(it.key);
    links.delete(it.key);
    if (link?.heatItemId === it.id) continue;
    changed++;
    const config = configOf(it, `deployments.${i}`);
    const values = {
      ...it.values,
      deploy_server_id: it.serverId,
      deploy_stack_id: it.stackId,
      deploy_resource_name: it.resourceName,
    };
    let d = link ? await tx.deployment(link.deploymentId) : undefined;
    const current = d && (await tx.config(d.configId));
    if (d && current && sameConfig(current, config) && !(d.current.action === 'DELETE' && !d.current.signalled)) {
      d = await tx.updateDeployment(d.id, { revises: d.current.revision, inputValues: values, action: it.action }, who);
    } else {
      if (d) await tx.removeDeployment(d.id);
      const cfg = await tx.createConfig(config, who);
      d = await tx.createDeployment(
        { node, configId: cfg.id, name: it.name, actions: [...DEPLOY_ACTIONS], action: it.action, inputValues: values },
        who,
      );
    }
    const signal = signalKeyOf(it, source.project) ?? null;
    const next: HeatLink = {
      deploymentId: d.id,
      node,
      source: sourceOf(source),
      heatKey: it.key,
      heatItemId: it.id,
      signal,
    };
    await o.putHeatLink(next);
  }
  for (const gone of links.values()) {
    changed++;
    await tx.removeDeployment(gone.deploymentId);
  }
  return changed;
}

export interface HeatObjectsOptions {
  store: Store;
  /** After a commit: wake-ups and events (the service's, through the change feed when there is one). */
  committed(c: ChangeSet): Promise<void>;
  /**
   * The accounts whose metadata may drive Herald's nodes: a container named after a node is that
   * node's metadata only in these; in any other account it is a plain object. Herald's nodes are
   * not a tenant's, so without this any project could name a container after any node.
   */
  heatProjects: readonly string[];
  now?: () => number;
}

/** The operations of Heat's object store over the store. */
export class HeatObjects {
  readonly #store: Store;
  readonly #committed: (c: ChangeSet) => Promise<void>;
  readonly #now: () => number;
  readonly #heatProjects: ReadonlySet<string>;

  constructor(o: HeatObjectsOptions) {
    this.#store = o.store;
    this.#heatProjects = new Set(o.heatProjects);
    this.#committed = o.committed;
    this.#now = o.now ?? Date.now;
  }

  read<T>(fn: (o: ObjectRows) => Promise<T>): Promise<T> {
    return this.#store.readObjects(fn);
  }

  async #write<T>(fn: (tx: StoreTx) => Promise<T>): Promise<T> {
    const { result, changes } = await this.#store.transaction(fn);
    await this.#committed(changes);
    return result;
  }

  /** Sets the account's temp-url key unless one is set; `kept` when another key stays in force. */
  async setTempUrlKey(project: string, key: string): Promise<{ kept: boolean }> {
    const inForce = await this.#write((tx) => tx.objects.setTempUrlKey(project, key));
    return { kept: inForce !== key };
  }

  putContainer(project: string, name: string): Promise<boolean> {
    return this.#write((tx) => tx.objects.putContainer(project, name));
  }

  deleteContainer(project: string, name: string): Promise<'deleted' | 'not_empty' | 'missing'> {
    return this.#write((tx) => tx.objects.deleteContainer(project, name));
  }

  /**
   * Stores the object; when its container names a Herald node, its body is that node's metadata
   * from Heat and becomes the node's deployments in the same transaction.
   * @throws HeraldError heat_metadata_invalid (a node's metadata Herald cannot serve: nothing is stored)
   */
  put(key: ObjectKey, body: Buffer, contentType: string, who: string): Promise<PutResult> {
    const nowMs = this.#now();
    return this.#write(async (tx) => {
      const o = tx.objects;
      const before = await o.get(key);
      const etag = md5(body);
      await o.put({ ...key, body, contentType, etag, modifiedMs: nowMs });
      const node = await this.#nodeOf(tx, key);
      let items: HeatItem[] = [];
      if (node) {
        let doc: unknown;
        try {
          doc = JSON.parse(body.toString('utf8'));
        } catch {
          throw new HeraldError('heat_metadata_invalid', `the metadata of node ${node.id} is not JSON`);
        }
        items = readHeatMetadata(doc);
        checkSignalAccounts(items, key.project);
      } else if (body[0] === 0x7b) {
        try {
          items = readHeatMetadata(JSON.parse(body.toString('utf8')));
        } catch {
          // a plain object
        }
      }
      await clearSignals(o, items, itemIdsOf(before?.body), key.project, nowMs);
      if (!node) return { etag, deployments: null, changed: 0 };
      const changed = await reconcile(tx, node.id, key, items, who);
      return { etag, deployments: items.length, changed };
    });
  }

  /** Deletes the object; a node's metadata object takes the deployments it made with it. */
  delete(key: ObjectKey): Promise<boolean> {
    return this.#write(async (tx) => {
      const gone = await tx.objects.delete(key);
      const node = gone ? await this.#nodeOf(tx, key) : undefined;
      if (node) await reconcile(tx, node.id, key, [], 'heat');
      return gone;
    });
  }

  /** The Herald node whose metadata `key` is: its container's name, in an account whose Heat drives nodes. */
  async #nodeOf(tx: StoreTx, key: ObjectKey) {
    return this.#heatProjects.has(key.project) ? await tx.node(key.container) : undefined;
  }

  head(key: ObjectKey): Promise<ObjectHead | undefined> {
    return this.read((o) => o.head(key));
  }

  get(key: ObjectKey): Promise<StoredObject | undefined> {
    return this.read((o) => o.get(key));
  }
}

const sourceOf = (k: ObjectKey): string => `${k.project}/${k.container}/${k.name}`;
