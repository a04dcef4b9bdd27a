/**
 * Heat's metadata document read into what Herald's deployments are made of
 * (controller/model/heat-metadata.ts): the keys that follow one Heat deployment across its
 * updates, the derived inputs, the transports served, and the refusals with their fields.
 */
import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { readHeatMetadata } from '../../controller/model/heat-metadata.js';
import { HeraldError } from '../../protocol/errors.js';

const example = JSON.parse(
  fs.readFileSync(new URL('../fixtures/heat/example-metadata-put.json', import.meta.url), 'utf8'),
) as { deployments: Array<Record<string, unknown>> };

function item(over: Record<string, unknown> = {}, inputs: Record<string, string> = {}): Record<string, unknown> {
  const base = structuredClone(example.deployments[0]!) as { inputs: Array<{ name: string; value?: unknown }> };
  for (const [k, v] of Object.entries(inputs)) {
    const i = base.inputs.find((x) => x.name === k);
    if (i) i.value = v;
    else base.inputs.push({ name: k, value: v });
  }
  return { ...base, ...over };
}

function codeOf(fn: () => unknown): { code: string; field: string | undefined } {
  try {
    fn();
  } catch (e) {
    if (e instanceof HeraldError) return { code: e.code, field: e.field };
    throw e;
  }
  throw new Error('did not throw');
}

describe('readHeatMetadata', () => {
  it("reads Heat's item: declared inputs and values apart from the derived ones, the action, the signal", () => {
    const [it0] = readHeatMetadata(example);
    expect(it0!.inputs.map((i) => i.name)).toEqual(['greeting']);
    expect(it0!.values).toEqual({ greeting: 'mars' });
    expect(it0!.action).toBe('UPDATE');
    expect(it0!.stackId).toBe('b-tempurl/e9f4eada-06e8-445b-84bb-883c6e531bc5');
    expect(it0!.resourceName).toBe('deployment');
    expect(it0!.signalUrl).toContain('temp_url_sig=');
    // the key is the signal object without the TempURL's query: the same through updates
    expect(it0!.key).toBe(
      'http://127.0.0.1:18080/v1/AUTH_admin/e9f4eada-06e8-445b-84bb-883c6e531bc5/b-tempurl-deployment-pvgxugnsafp2',
    );
  });

  it('a resource and its replacement (two signal objects) are two deployments; two NO_SIGNAL items of one resource are told apart', () => {
    const replaced = item({ id: 'new-id' }, { deploy_signal_id: 'https://h/v1/AUTH_a/s/obj-2?temp_url_sig=x' });
    const items = readHeatMetadata({ deployments: [example.deployments[0], replaced] });
    expect(new Set(items.map((i) => i.key)).size).toBe(2);
    const quiet = (id: string) => item({ id }, { deploy_signal_transport: 'NO_SIGNAL', deploy_signal_id: '' });
    const two = readHeatMetadata({ deployments: [quiet('a'), quiet('b')] });
    expect(two.map((i) => i.key)).toEqual([
      'b-tempurl/e9f4eada-06e8-445b-84bb-883c6e531bc5/deployment',
      'b-tempurl/e9f4eada-06e8-445b-84bb-883c6e531bc5/deployment#2',
    ]);
    expect(two[0]!.signalUrl).toBeNull();
  });

  it('no deployments is an empty list (a server before any deployment)', () => {
    expect(readHeatMetadata({ 'os-collect-config': {} })).toEqual([]);
    expect(readHeatMetadata({ deployments: [] })).toEqual([]);
  });

  it('refuses what Herald cannot serve, naming the field', () => {
    expect(codeOf(() => readHeatMetadata([]))).toEqual({ code: 'heat_metadata_invalid', field: 'metadata' });
    expect(codeOf(() => readHeatMetadata({ deployments: {} }))).toEqual({
      code: 'heat_metadata_invalid',
      field: 'deployments',
    });
    expect(
      codeOf(() => readHeatMetadata({ deployments: [item({}, { deploy_signal_transport: 'HEAT_SIGNAL' })] })),
    ).toEqual({ code: 'heat_metadata_invalid', field: 'deployments.0.inputs.deploy_signal_transport' });
    expect(codeOf(() => readHeatMetadata({ deployments: [item({}, { deploy_action: 'EXPLODE' })] }))).toEqual({
      code: 'heat_metadata_invalid',
      field: 'deployments.0.inputs.deploy_action',
    });
    expect(codeOf(() => readHeatMetadata({ deployments: [item({}, { deploy_stack_id: '' })] }))).toEqual({
      code: 'heat_metadata_invalid',
      field: 'deployments.0.inputs.deploy_stack_id',
    });
    expect(codeOf(() => readHeatMetadata({ deployments: [item({ id: 7 })] }))).toEqual({
      code: 'heat_metadata_invalid',
      field: 'deployments.0.id',
    });
  });

  it('drops the credential inputs of other transports: they are never kept', () => {
    const [it0] = readHeatMetadata({ deployments: [item({}, { deploy_password: 'secret', deploy_auth_url: 'x' })] });
    expect(JSON.stringify(it0)).not.toContain('secret');
  });
});
