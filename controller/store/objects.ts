/**
 * The rows of Heat's object store (docs/heat.md; tables in objects-schema.ts), over the statements
 * both stores share: each account's temp-url key, containers, objects with their bodies, and the
 * links from the deployments Heat's metadata made to where they came from and where their results
 * go. Reads run anywhere; writes only inside a transaction (the caller's).
 */
import type { Statements } from './statements.js';

/** An object's address: `/v1/AUTH_<project>/<container>/<name>`. */
export interface ObjectKey {
  project: string;
  container: string;
  name: string;
}

export interface ObjectHead extends ObjectKey {
  bytes: number;
  contentType: string;
  /** MD5 of the body, hex (Swift's ETag). */
  etag: string;
  /** When it was written, epoch ms. */
  modifiedMs: number;
}

export interface StoredObject extends ObjectHead {
  body: Buffer;
}

export interface ContainerInfo {
  createdAt: string;
  objects: number;
  bytes: number;
}

/** A deployment made from an item of Heat's metadata for a node. */
export interface HeatLink {
  deploymentId: string;
  node: string;
  /** The metadata object it came from: `<project>/<container>/<object>`. */
  source: string;
  /** Heat's deployment: `<deploy_stack_id>/<deploy_resource_name>`. */
  heatKey: string;
  /** The item's `id` (Heat's derived config) its current revision was made from. */
  heatItemId: string;
  /** The signal object Heat reads the result from, when it is in this store. */
  signal: ObjectKey | null;
}

interface HeatLinkRow {
  deployment_id: string;
  node: string;
  source: string;
  heat_key: string;
  heat_item_id: string;
  signal_project: string | null;
  signal_container: string | null;
  signal_object: string | null;
}

interface HeadRow {
  bytes: number | string;
  content_type: string;
  etag: string;
  modified_ms: number | string;
}

const linkOf = (r: HeatLinkRow): HeatLink => ({
  deploymentId: r.deployment_id,
  node: r.node,
  source: r.source,
  heatKey: r.heat_key,
  heatItemId: r.heat_item_id,
  signal:
    r.signal_project !== null && r.signal_container !== null && r.signal_object !== null
      ? { project: r.signal_project, container: r.signal_container, name: r.signal_object }
      : null,
});

const headOf = (k: ObjectKey, r: HeadRow): ObjectHead => ({
  ...k,
  bytes: Number(r.bytes),
  contentType: r.content_type,
  etag: r.etag,
  modifiedMs: Number(r.modified_ms),
});

export class ObjectRows {
  readonly #s: Statements;
  readonly #now: () => number;

  constructor(s: Statements, now: () => number) {
    this.#s = s;
    this.#now = now;
  }

  /** The account's temp-url key, or null when none is set. */
  async tempUrlKey(project: string): Promise<string | null> {
    const r = (await this.#s.objAccountGet.get(project)) as { temp_url_key: string | null } | undefined;
    return r?.temp_url_key ?? null;
  }

  /** Sets the account's key unless one is set already; the key in force after. */
  async setTempUrlKey(project: string, key: string): Promise<string> {
    await this.#s.objAccountSetKey.run(project, key, new Date(this.#now()).toISOString());
    return (await this.tempUrlKey(project))!;
  }

  async container(project: string, name: string): Promise<ContainerInfo | undefined> {
    const r = (await this.#s.objContainerGet.get(project, name)) as
      | { created_at: string; n: number | string; bytes: number | string }
      | undefined;
    return r && { createdAt: r.created_at, objects: Number(r.n), bytes: Number(r.bytes) };
  }

  async containerCount(project: string): Promise<number> {
    return Number(((await this.#s.objContainerCount.get(project)) as { n: number | string }).n);
  }

  async containers(project: string, marker: string, limit: number): Promise<string[]> {
    return ((await this.#s.objContainerList.all(project, marker, limit)) as Array<{ name: string }>).map((r) => r.name);
  }

  /** True when it was made, false when it existed. */
  async putContainer(project: string, name: string): Promise<boolean> {
    const r = await this.#s.objContainerInsert.run(project, name, new Date(this.#now()).toISOString());
    return r.changes > 0;
  }

  /** Removes an empty container: 'not_empty' while it holds objects, 'missing' when there is none. */
  async deleteContainer(project: string, name: string): Promise<'deleted' | 'not_empty' | 'missing'> {
    const n = Number(((await this.#s.objCount.get(project, name)) as { n: number | string }).n);
    if (n > 0) return 'not_empty';
    return (await this.#s.objContainerDelete.run(project, name)).changes > 0 ? 'deleted' : 'missing';
  }

  async objectCount(project: string, container: string): Promise<number> {
    return Number(((await this.#s.objCount.get(project, container)) as { n: number | string }).n);
  }

  /** The container's objects after `marker`, by name, at most `limit`. */
  async list(project: string, container: string, marker: string, limit: number): Promise<ObjectHead[]> {
    const rows = (await this.#s.objList.all(project, container, marker, limit)) as Array<HeadRow & { name: string }>;
    return rows.map((r) => headOf({ project, container, name: r.name }, r));
  }

  async head(k: ObjectKey): Promise<ObjectHead | undefined> {
    const r = (await this.#s.objHead.get(k.project, k.container, k.name)) as HeadRow | undefined;
    return r && headOf(k, r);
  }

  async get(k: ObjectKey): Promise<StoredObject | undefined> {
    const r = (await this.#s.objGet.get(k.project, k.container, k.name)) as (HeadRow & { body: Buffer }) | undefined;
    if (!r) return undefined;
    const body = Buffer.isBuffer(r.body) ? r.body : Buffer.from(r.body as Uint8Array);
    return { ...headOf(k, { ...r, bytes: body.length }), body };
  }

  async put(o: Omit<StoredObject, 'bytes'>): Promise<void> {
    await this.#s.objPut.run(o.project, o.container, o.name, o.body, o.contentType, o.etag, o.modifiedMs);
  }

  async delete(k: ObjectKey): Promise<boolean> {
    return (await this.#s.objDelete.run(k.project, k.container, k.name)).changes > 0;
  }

  async heatLinks(node: string, source: string): Promise<HeatLink[]> {
    return ((await this.#s.heatLinksOf.all(node, source)) as HeatLinkRow[]).map(linkOf);
  }

  async heatLink(deploymentId: string): Promise<HeatLink | undefined> {
    const r = (await this.#s.heatLinkGet.get(deploymentId)) as HeatLinkRow | undefined;
    return r && linkOf(r);
  }

  async putHeatLink(l: HeatLink): Promise<void> {
    await this.#s.heatLinkPut.run(
      l.deploymentId,
      l.node,
      l.source,
      l.heatKey,
      l.heatItemId,
      l.signal?.project ?? null,
      l.signal?.container ?? null,
      l.signal?.name ?? null,
    );
  }
}
