/**
 * Runs one deployment item (docs/architecture.md) and turns whatever happens into a RunResult: a bad item,
 * a missing hook, a timeout or a refused output fails that deployment, never the agent.
 *
 * Status codes Herald chooses itself (a hook's own exit code is passed through unchanged):
 * - HOOK_ERROR_STATUS_CODE (-1): refused or failed before or around the run (bad_name,
 *   forbidden_input, nul_in_input, unknown_group, unsafe_hooks_dir, bad_config, hook_failed,
 *   hook_answer_too_deep).
 *   Never a real exit code, so it cannot be mistaken for one. A refused output
 *   (output_not_regular, output_too_large) keeps a non-zero exit code and turns 0 into -1.
 * - HOOK_TIMEOUT_STATUS_CODE (124, as timeout(1)): hook_timeout.
 * - INTERRUPTED_STATUS_CODE (143 = 128 + SIGTERM): interrupted (agent shutdown).
 * - A hook killed by a signal it did not get from Herald: 128 + the signal number, as shells say.
 * `status_reason` is then `<code>: <message>`, and the same line is appended to deploy_stderr.
 */
import { chmodSync, mkdtempSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { HeraldError, type ErrorCode } from '../../protocol/errors.js';
import { jsonTextDepth, withinJsonDepth } from '../../protocol/json-depth.js';
import {
  checkGroupName,
  checkInputName,
  checkOutputName,
  type ComponentConfig,
  type MetadataItem,
} from '../../protocol/heat.js';
import {
  MAX_TIMER_DELAY_MS,
  HOOK_KILL_GRACE_MS,
  HOOK_OUTPUT_DRAIN_MS,
  HOOK_TIMEOUT_S,
  MAX_HOOK_OUTPUT_BYTES,
  MAX_JSON_DEPTH_LEVELS,
  MAX_OUTPUT_FILE_BYTES,
} from '../../protocol/limits.js';
import { ensurePrivateDirSync } from '../atomic-file.js';
import { INTERRUPTED_STATUS_CODE } from '../state.js';
import { baseEnv, inputWithNul, scriptEnv } from './env.js';
import { resolveHook } from './hooks-dir.js';
import { hiddenValues, maskResult } from './mask.js';
import { readOutputs } from './outputs.js';
import { runProcess, type ProcessResult } from './run-process.js';
import type { RunOptions, RunResult } from './types.js';

export { INTERRUPTED_STATUS_CODE };
/** deploy_status_code of an item Herald refused or could not run. */
export const HOOK_ERROR_STATUS_CODE = -1;
/** deploy_status_code of a run killed at its timeout. */
export const HOOK_TIMEOUT_STATUS_CODE = 124;

interface Resolved {
  runsDir: string;
  hooksDir: string | undefined;
  signal: AbortSignal | undefined;
  onSpawn: ((pid: number) => void) | undefined;
  onOutput: RunOptions['onOutput'];
  timeoutMs: number;
  killGraceMs: number;
  drainMs: number;
  uid: number | undefined;
  env: NodeJS.ProcessEnv;
  log: RunOptions['log'];
  launcher: RunOptions['launcher'];
}

/** Fails the item with a Herald code; thrown inside this module, turned into a RunResult. */
class ItemFailure extends HeraldError {}

/**
 * Runs `item` per its group. Never throws for anything about the item or its hook; it may throw
 * only for a programming error in the options (e.g. a missing runsDir). Values of hidden inputs
 * are masked (`***`) in the result's stdout, stderr, outputs and reason (docs/architecture.md).
 */
export async function runItem(item: MetadataItem, opts: RunOptions): Promise<RunResult> {
  const result = await runUnmasked(item, opts);
  let hidden: string[];
  try {
    hidden = hiddenValues(Array.isArray(item?.inputs) ? item.inputs : []);
  } catch {
    hidden = [];
  }
  return maskResult(result, hidden);
}

async function runUnmasked(item: MetadataItem, opts: RunOptions): Promise<RunResult> {
  if (typeof opts.runsDir !== 'string' || opts.runsDir === '') throw new TypeError('runItem: runsDir is required');
  const o: Resolved = {
    runsDir: resolve(opts.runsDir),
    hooksDir: opts.hooksDir,
    signal: opts.signal,
    onSpawn: opts.onSpawn,
    onOutput: opts.onOutput,
    timeoutMs: Math.min(itemTimeoutMs(item) ?? opts.timeoutMs ?? HOOK_TIMEOUT_S * 1000, MAX_TIMER_DELAY_MS),
    killGraceMs: opts.killGraceMs ?? HOOK_KILL_GRACE_MS,
    drainMs: opts.drainMs ?? HOOK_OUTPUT_DRAIN_MS,
    uid: opts.uid ?? process.getuid?.(),
    env: opts.env ?? process.env,
    log: opts.log,
    launcher: opts.launcher,
  };
  try {
    const { inputNames, outputNames } = checkItem(item);
    if (o.signal?.aborted === true)
      throw new ItemFailure('interrupted', 'the agent is stopping; the item did not start');
    if (item.group === 'script') return await runScript(item, item.config, outputNames, o);
    if (item.group === 'component') return await runComponent(item, inputNames, outputNames, o);
    return await runHook(item, item.group, outputNames, o);
  } catch (err) {
    if (err instanceof HeraldError) {
      o.log?.warn({ item: item?.id, deployment_id: item?.deployment_id, code: err.code }, 'deployment item refused');
      return failed(
        err.code,
        err.message,
        err.code === 'interrupted' ? INTERRUPTED_STATUS_CODE : HOOK_ERROR_STATUS_CODE,
      );
    }
    o.log?.warn({ item: item?.id, deployment_id: item?.deployment_id, err }, 'deployment item failed unexpectedly');
    return failed(
      'hook_failed',
      `the agent could not run the item: ${(err as Error)?.message ?? String(err)}`,
      HOOK_ERROR_STATUS_CODE,
    );
  }
}

/** Checks every name the item carries and its input values; returns the names. */
function checkItem(item: MetadataItem): { inputNames: Set<string>; outputNames: string[] } {
  checkGroupName(item.group, 'group');
  if (!Array.isArray(item.inputs) || !Array.isArray(item.outputs))
    throw new ItemFailure('bad_config', 'inputs and outputs must be lists');
  const inputNames = new Set<string>();
  item.inputs.forEach((input, i) => {
    inputNames.add(checkInputName(input?.name, `inputs[${i}].name`));
  });
  const outputNames = item.outputs.map((output, i) => checkOutputName(output?.name, `outputs[${i}].name`));
  const nul = inputWithNul(item.inputs);
  if (nul !== undefined) throw new ItemFailure('nul_in_input', `input ${nul} holds a NUL byte`);
  // the controller refuses deeper values; checked again before anything stringifies them
  for (const [what, v] of [
    ['config', item.config],
    ['options', item.options],
    ...item.inputs.map((x) => [`input ${x.name}`, x.value] as const),
  ] as const) {
    if (!withinJsonDepth(v))
      throw new ItemFailure('bad_config', `${what} is nested deeper than ${MAX_JSON_DEPTH_LEVELS} levels`);
  }
  return { inputNames, outputNames: [...new Set(outputNames)] };
}

/** `options.timeout` in seconds, when it is a positive number (or numeric string). */
function itemTimeoutMs(item: MetadataItem): number | undefined {
  const t = (item?.options as Record<string, unknown> | undefined)?.timeout;
  const n = typeof t === 'string' && t.trim() !== '' ? Number(t) : t;
  return typeof n === 'number' && Number.isFinite(n) && n > 0 ? Math.ceil(n * 1000) : undefined;
}

function failed(
  code: ErrorCode,
  message: string,
  statusCode: number,
  base?: Omit<RunResult, 'deploy_status_code'>,
): RunResult {
  const reason = `${code}: ${message}`;
  const stderr = base?.deploy_stderr ?? '';
  return {
    deploy_status_code: statusCode,
    deploy_stdout: base?.deploy_stdout ?? '',
    deploy_stderr: `${stderr}${stderr === '' || stderr.endsWith('\n') ? '' : '\n'}[herald] ${reason}\n`,
    outputs: base?.outputs ?? {},
    status_reason: reason,
  };
}

/** Runs `fn` in a fresh 0700 directory under runsDir, removed afterwards (it may hold secrets). */
async function withRunDir<T>(o: Resolved, fn: (dir: string) => Promise<T>): Promise<T> {
  // synchronous on purpose, up to the hook's start: a few local-disk calls of microseconds each,
  // where each asynchronous one cost a thread-pool round trip (~0.3 ms) before the spawn
  ensurePrivateDirSync(o.runsDir, o.log);
  const dir = mkdtempSync(join(o.runsDir, 'run-'));
  try {
    chmodSync(dir, 0o700);
    return await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true }).catch(() => undefined);
  }
}

function processOptions(o: Resolved) {
  return {
    timeoutMs: o.timeoutMs,
    killGraceMs: o.killGraceMs,
    drainMs: o.drainMs,
    maxOutputBytes: MAX_HOOK_OUTPUT_BYTES,
    ...(o.signal === undefined ? {} : { signal: o.signal }),
    ...(o.onSpawn === undefined ? {} : { onSpawn: o.onSpawn }),
    ...(o.onOutput === undefined ? {} : { onOutput: o.onOutput }),
    ...(o.launcher === undefined ? {} : { launcher: o.launcher }),
  };
}

/** The result of a run that timed out, was aborted or could not start; undefined otherwise. */
function abnormal(p: ProcessResult, o: Resolved, what: string): RunResult | undefined {
  const base = { deploy_stdout: p.stdout, deploy_stderr: p.stderr, outputs: {} };
  if (p.spawnError !== undefined)
    return failed('hook_failed', `could not start ${what}: ${p.spawnError.message}`, HOOK_ERROR_STATUS_CODE, base);
  if (p.timedOut) {
    return failed(
      'hook_timeout',
      `${what} ran past its ${o.timeoutMs / 1000} s timeout; its process group was killed`,
      HOOK_TIMEOUT_STATUS_CODE,
      base,
    );
  }
  if (p.aborted)
    return failed(
      'interrupted',
      `the agent stopped while ${what} ran; its process group was killed`,
      INTERRUPTED_STATUS_CODE,
      base,
    );
  return undefined;
}

/** The built-in `script` group: config as an executable file, inputs as env, outputs as files. */
async function runScript(item: MetadataItem, config: unknown, outputNames: string[], o: Resolved): Promise<RunResult> {
  if (typeof config !== 'string') throw new ItemFailure('bad_config', 'a script config must be a string');
  return withRunDir(o, async (dir) => {
    const file = join(dir, 'config');
    writeFileSync(file, config, { mode: 0o700, flag: 'wx' });
    chmodSync(file, 0o700);
    const outputsPath = join(dir, 'outputs');
    const p = await runProcess({
      file,
      cwd: dir,
      env: scriptEnv(o.env, item.inputs, outputsPath),
      ...processOptions(o),
    });
    const bad = abnormal(p, o, 'the script');
    if (bad !== undefined) return bad;
    const code = p.exitCode ?? HOOK_ERROR_STATUS_CODE;
    const { values, problems } = await readOutputs(outputsPath, outputNames, MAX_OUTPUT_FILE_BYTES);
    const result: RunResult = {
      deploy_status_code: code,
      deploy_stdout: p.stdout,
      deploy_stderr: p.stderr,
      outputs: values,
    };
    const first = problems[0];
    if (first === undefined) return result;
    // An output planted as a symlink is an attack indicator: the deployment fails, named.
    const message = problems.map((x) => x.message).join('; ');
    o.log?.warn(
      { item: item.id, deployment_id: item.deployment_id, codes: problems.map((x) => x.code) },
      'hook outputs refused',
    );
    return failed(first.code, message, code !== 0 ? code : HOOK_ERROR_STATUS_CODE, result);
  });
}

/** The built-in `component` group: the sub-config whose actions hold deploy_action, or nothing. */
async function runComponent(
  item: MetadataItem,
  inputNames: Set<string>,
  outputNames: string[],
  o: Resolved,
): Promise<RunResult> {
  const configs = parseComponent(item.config);
  const action = inputNames.has('deploy_action')
    ? item.inputs.find((i) => i.name === 'deploy_action')?.value
    : undefined;
  const sub = typeof action === 'string' ? configs.find((c) => c.actions.includes(action)) : undefined;
  if (sub === undefined) return { deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} };
  if (sub.tool === 'script') return runScript(item, sub.config, outputNames, o);
  if (sub.tool === 'component') throw new ItemFailure('bad_config', 'a component config cannot nest another component');
  return runHook({ ...item, group: sub.tool, config: sub.config }, sub.tool, outputNames, o);
}

function parseComponent(config: unknown): ComponentConfig['configs'] {
  const configs = (config as Partial<ComponentConfig> | null)?.configs;
  if (typeof config !== 'object' || config === null || !Array.isArray(configs)) {
    throw new ItemFailure('bad_config', 'a component config must be {"configs":[...]}');
  }
  return configs.map((c, i) => {
    if (
      typeof c !== 'object' ||
      c === null ||
      !Array.isArray(c.actions) ||
      !c.actions.every((a) => typeof a === 'string')
    ) {
      throw new ItemFailure('bad_config', `config.configs[${i}] needs "actions": a list of action names`);
    }
    checkGroupName(c.tool, `config.configs[${i}].tool`);
    return c;
  });
}

/**
 * Any other group: `<hooksDir>/<group>` with Heat's hook protocol: the item as JSON on stdin, a
 * JSON object on stdout with deploy_stdout, deploy_stderr, deploy_status_code and the outputs as
 * top-level keys. Declared outputs are moved into `outputs`; other keys are ignored, as Heat's
 * engine does. The hook's environment is the agent's PATH, HOME, LANG and LC_* only: inputs come
 * on stdin.
 */
async function runHook(item: MetadataItem, group: string, outputNames: string[], o: Resolved): Promise<RunResult> {
  const hook = await resolveHook(o.hooksDir, group, o.uid);
  return withRunDir(o, async (dir) => {
    const p = await runProcess({
      file: hook,
      cwd: dir,
      env: baseEnv(o.env),
      stdin: JSON.stringify(item),
      ...processOptions(o),
    });
    const bad = abnormal(p, o, `hook ${group}`);
    if (bad !== undefined) return bad;
    const exitCode = p.exitCode ?? HOOK_ERROR_STATUS_CODE;
    // the one depth guard (docs/api.md), on the text before it is parsed: an answer nested thousands
    // of levels would overflow the stack of whatever stringifies or walks it later (the signal)
    if (jsonTextDepth(p.stdout) > MAX_JSON_DEPTH_LEVELS) {
      return failed(
        'hook_answer_too_deep',
        `hook ${group}'s answer on stdout is nested deeper than ${MAX_JSON_DEPTH_LEVELS} levels; not read`,
        exitCode !== 0 ? exitCode : HOOK_ERROR_STATUS_CODE,
        { deploy_stdout: p.stdout, deploy_stderr: p.stderr, outputs: {} },
      );
    }
    let answer: unknown;
    try {
      answer = p.stdout.trim() === '' ? undefined : JSON.parse(p.stdout);
    } catch {
      answer = undefined;
    }
    if (typeof answer !== 'object' || answer === null || Array.isArray(answer)) {
      return failed(
        'hook_failed',
        `hook ${group} exited ${exitCode} without a JSON object on stdout`,
        exitCode !== 0 ? exitCode : HOOK_ERROR_STATUS_CODE,
        { deploy_stdout: p.stdout, deploy_stderr: p.stderr, outputs: {} },
      );
    }
    const a = answer as Record<string, unknown>;
    const outputs: Record<string, unknown> = {};
    for (const name of outputNames) if (Object.hasOwn(a, name)) outputs[name] = a[name];
    return {
      deploy_status_code: statusCodeOf(a.deploy_status_code) ?? exitCode,
      deploy_stdout: textOf(a.deploy_stdout) ?? '',
      deploy_stderr: textOf(a.deploy_stderr) ?? p.stderr,
      outputs,
    };
  });
}

function statusCodeOf(v: unknown): number | undefined {
  if (typeof v === 'number' && Number.isInteger(v)) return v;
  if (typeof v === 'string' && /^-?\d+$/.test(v.trim())) return Number(v);
  return undefined;
}

function textOf(v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  return typeof v === 'string' ? v : JSON.stringify(v);
}
