/**
 * The metadata body is written as JSON text from parts encoded once per config
 * (controller/service/metadata-builder.ts). Here it is held against the plain way of making it: the
 * document built as objects in the shape of protocol/heat.ts, then `JSON.stringify`. Byte for
 * byte, since the agent checks the body's SHA-256 and the document is Heat's contract with hooks.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import type { MetadataDocument, MetadataInput, MetadataItem } from '../../protocol/heat.js';
import { encodeMetadataDocument, MetadataCache, SIGNAL_TRANSPORT } from '../../controller/service/metadata-builder.js';
import type { ConfigRecord, MetadataDeployment, MetadataSource } from '../../controller/model/records.js';

const DESCRIPTIONS: Record<string, string> = {
  deploy_server_id: 'ID of the server being deployed to',
  deploy_action: 'Name of the current action being deployed',
  deploy_stack_id: 'ID of the stack this deployment belongs to',
  deploy_resource_name: 'Name of this deployment resource in the stack',
  deploy_signal_transport: 'How the server should signal to heat with the deployment output values.',
  deploy_signal_id: 'ID of signal to use for signaling output values',
  deploy_signal_verb: 'HTTP verb to use for signaling outputvalues',
};

/** The document as objects, the way Heat's SoftwareDeployment builds it (the reference). */
function referenceDocument(
  src: MetadataSource,
  signalUrl: (node: string, id: string) => string,
  hiddenOf: (d: MetadataDeployment) => ReadonlySet<string>,
): MetadataDocument {
  const items: MetadataItem[] = src.entries.map(({ deployment: d, config: c, cluster }) => {
    const r = d.current;
    const name = d.name ?? c.name;
    const inputs: MetadataInput[] = [];
    const hidden = hiddenOf(d);
    for (const i of c.inputs) {
      const v = Object.hasOwn(r.inputValues, i.name) ? r.inputValues[i.name] : i.default;
      const input: MetadataInput = { name: i.name, type: i.type, value: v ?? (i.type === 'String' ? '' : null) };
      if (i.description !== undefined) input.description = i.description;
      if (hidden.has(i.name)) input.hidden = true;
      inputs.push(input);
    }
    for (const [k, v] of Object.entries(r.inputValues)) {
      if (c.inputs.some((i) => i.name === k) || Object.hasOwn(DESCRIPTIONS, k)) continue;
      const input: MetadataInput = { name: k, type: 'String', value: typeof v === 'string' ? v : JSON.stringify(v) };
      if (hidden.has(k)) input.hidden = true;
      inputs.push(input);
    }
    // a deployment Heat made keeps Heat's server, stack and resource (controller/service/heat.ts)
    const own = (k: string): string | undefined =>
      typeof r.inputValues[k] === 'string' ? (r.inputValues[k] as string) : undefined;
    const derived: Record<string, string> = {
      deploy_server_id: own('deploy_server_id') ?? d.node,
      deploy_action: r.action,
      deploy_stack_id: own('deploy_stack_id') ?? (cluster ? `${cluster.name}/${cluster.id}` : `herald/${d.id}`),
      deploy_resource_name: own('deploy_resource_name') ?? name,
      deploy_signal_transport: SIGNAL_TRANSPORT,
      deploy_signal_id: signalUrl(d.node, d.id),
      deploy_signal_verb: 'POST',
    };
    for (const [k, v] of Object.entries(derived))
      inputs.push({ name: k, type: 'String', value: v, description: DESCRIPTIONS[k]! });
    return {
      id: r.itemId,
      name,
      group: c.group,
      creation_time: d.createdAt,
      config: c.config,
      inputs,
      outputs: c.outputs.map((o) => ({
        name: o.name,
        type: o.type,
        error_output: o.error_output,
        ...(o.description !== undefined ? { description: o.description } : {}),
      })),
      options: c.options,
      deployment_id: d.id,
      revision: r.revision,
      signalled: r.signalled,
    };
  });
  const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
  items.sort(
    (a, b) => cmp(a.name, b.name) || cmp(a.creation_time, b.creation_time) || cmp(a.deployment_id, b.deployment_id),
  );
  return { node: src.node.id, generation: src.node.generation, deployments: items };
}

function config(over: Partial<ConfigRecord> & { id: string }): ConfigRecord {
  return {
    name: `cfg-${over.id}`,
    group: 'script',
    config: '#!/bin/sh\necho "hi" \\ \u00e9\u2028\n',
    inputs: [],
    outputs: [],
    options: {},
    createdAt: '2026-12-01T00:00:00.000Z',
    ...over,
  };
}

function deployment(
  id: string,
  over: Partial<Omit<MetadataDeployment, 'current'>> & { current?: Partial<MetadataDeployment['current']> } = {},
): MetadataDeployment {
  const { current, ...rest } = over;
  return {
    id,
    node: 'n1',
    configId: 'c',
    name: null,
    clusterId: null,
    createdAt: '2026-12-01T10:00:00.000Z',
    ...rest,
    current: { revision: 1, itemId: `item-${id}`, action: 'CREATE', inputValues: {}, signalled: false, ...current },
  };
}

const signalUrl = (node: string, id: string) =>
  `https://ctl.example:8443/v1/nodes/${encodeURIComponent(node)}/deployments/${encodeURIComponent(id)}/signal`;

function expectSame(src: MetadataSource, hiddenOf: (d: MetadataDeployment) => ReadonlySet<string> = () => new Set()) {
  const text = encodeMetadataDocument(src, signalUrl, hiddenOf);
  expect(text).toBe(JSON.stringify(referenceDocument(src, signalUrl, hiddenOf)));
  return JSON.parse(text) as MetadataDocument;
}

const rich = config({
  id: 'rich',
  name: 'rich',
  group: 'ansible',
  config: { configs: [{ actions: ['CREATE'], tool: 'script', config: 'echo "a"' }] },
  inputs: [
    { name: 'given', type: 'String', description: 'a "quoted" description' },
    { name: 'defaulted', type: 'Number', default: 7 },
    { name: 'null_default', type: 'String', default: null },
    { name: 'no_default_number', type: 'Number' },
    { name: 'no_default_string', type: 'String' },
    { name: 'given_null', type: 'Json', default: { a: 1 } },
    { name: 'secret', type: 'String', hidden: true },
    { name: 'list', type: 'CommaDelimitedList', default: ['x', 'y'] },
  ],
  outputs: [
    { name: 'out', type: 'String', error_output: false, description: 'an output' },
    { name: 'err', type: 'String', error_output: true },
  ],
  options: { retries: 2, nested: { a: [1, null, 'b'] } },
});

describe('the metadata body, encoded from parts per config', () => {
  it('is byte for byte the stringified document: inputs given, defaulted, null, undeclared, hidden; outputs; options', () => {
    const d = deployment('d1', {
      configId: 'rich',
      current: {
        revision: 12,
        signalled: true,
        inputValues: {
          given: 'v "1"\n',
          given_null: null,
          secret: 's3cr3t',
          undeclared_string: 'plain',
          undeclared_number: 4.5,
          undeclared_object: { k: ['v', 2, null] },
          undeclared_null: null,
          undeclared_bool: false,
          '10': 'integer-like key first',
        },
      },
    });
    const doc = expectSame({ node: node('n1', 42), entries: [{ deployment: d, config: rich, cluster: null }] }, () => {
      return new Set(['secret', 'undeclared_string']);
    });
    const byName = Object.fromEntries(doc.deployments[0]!.inputs.map((i) => [i.name, i]));
    expect(byName.given_null!.value).toBeNull(); // a null given is the type's empty value, not the default
    expect(byName.defaulted!.value).toBe(7);
    expect(byName.null_default!.value).toBe('');
    expect(byName.secret!.hidden).toBe(true);
    expect(byName.undeclared_string!.hidden).toBe(true);
    expect(byName.undeclared_object!.value).toBe('{"k":["v",2,null]}');
    expect(byName.deploy_stack_id!.value).toBe('herald/d1');
  });

  it("keeps Heat's own server, stack and resource of a deployment Heat made, once each; the signal stays Herald's", () => {
    const d = deployment('d9', {
      current: {
        inputValues: {
          deploy_server_id: 'a65e7166-server',
          deploy_stack_id: 'stack-1/e9f4eada',
          deploy_resource_name: 'install',
          deploy_signal_id: 'https://evil.example/steal',
        },
      },
    });
    const doc = expectSame({ node: node('n1', 3), entries: [{ deployment: d, config: rich, cluster: null }] }, () => {
      return new Set<string>();
    });
    const inputs = doc.deployments[0]!.inputs;
    const of = (k: string) => inputs.filter((i) => i.name === k).map((i) => i.value);
    expect(of('deploy_server_id')).toEqual(['a65e7166-server']);
    expect(of('deploy_stack_id')).toEqual(['stack-1/e9f4eada']);
    expect(of('deploy_resource_name')).toEqual(['install']);
    expect(of('deploy_signal_id')).toEqual([signalUrl('n1', 'd9')]);
    expect(of('deploy_signal_transport')).toEqual(['HERALD_SIGNAL']);
  });

  it('sorts items by name, then creation time, then id, and names a cluster in deploy_stack_id', () => {
    const plain = config({ id: 'plain', name: 'zeta' });
    const cluster = { id: 'cl-1', name: 'web', configs: [plain, rich] };
    const entries: MetadataSource['entries'] = [
      {
        deployment: deployment('d-b', { name: 'same', createdAt: '2026-12-01T10:00:01.000Z' }),
        config: plain,
        cluster,
      },
      {
        deployment: deployment('d-a', { name: 'same', createdAt: '2026-12-01T10:00:01.000Z' }),
        config: plain,
        cluster,
      },
      {
        deployment: deployment('d-c', { name: 'same', createdAt: '2026-12-01T10:00:00.000Z' }),
        config: plain,
        cluster,
      },
      { deployment: deployment('d-d'), config: plain, cluster: null }, // named by its config: zeta
      { deployment: deployment('d-e', { name: 'alpha', clusterId: 'cl-1' }), config: rich, cluster },
    ];
    const doc = expectSame({ node: node('n/1 é', 3), entries });
    expect(doc.deployments.map((i) => i.deployment_id)).toEqual(['d-e', 'd-c', 'd-a', 'd-b', 'd-d']);
    expect(doc.deployments[0]!.inputs.find((i) => i.name === 'deploy_stack_id')!.value).toBe('web/cl-1');
  });

  it('holds for a node with no deployments, and for one config record feeding many nodes in turn', () => {
    expectSame({ node: node('empty', 0), entries: [] });
    const shared = config({ id: 'shared', inputs: [{ name: 'x', type: 'String', default: 'dflt' }] });
    for (let i = 0; i < 5; i++) {
      const d = deployment(`d${i}`, { node: `n${i}`, current: { inputValues: i % 2 ? { x: `v${i}` } : {} } });
      const doc = expectSame({
        node: node(`n${i}`, i + 1),
        entries: [{ deployment: d, config: shared, cluster: null }],
      });
      expect(doc.deployments[0]!.inputs[0]!.value).toBe(i % 2 ? `v${i}` : 'dflt');
    }
  });
});

describe('MetadataCache', () => {
  it('keeps the body with the SHA-256 of its bytes, and never lets an older generation replace a newer one', () => {
    const cache = new MetadataCache(2);
    const b = cache.put('n1', 5, '{"a":"é"}');
    expect(b.body.toString('utf8')).toBe('{"a":"é"}');
    expect(b.sha256).toBe(createHash('sha256').update(Buffer.from('{"a":"é"}', 'utf8')).digest('base64url'));
    cache.put('n1', 4, '{"old":true}');
    expect(cache.peek('n1', 5)?.body.toString()).toBe('{"a":"é"}');
    expect(cache.peek('n1', 4)).toBeUndefined();
    cache.put('n2', 1, '{}');
    cache.peek('n1', 5); // n1 used last: n2 goes first
    cache.put('n3', 1, '{}');
    expect([cache.peek('n1', 5) !== undefined, cache.peek('n2', 1), cache.size]).toEqual([true, undefined, 2]);
  });
});

function node(id: string, generation: number): MetadataSource['node'] {
  return {
    id,
    endpoint: null,
    generation,
    ackedGeneration: null,
    createdAt: '2026-12-01T00:00:00.000Z',
    updatedAt: '2026-12-01T00:00:00.000Z',
  };
}
