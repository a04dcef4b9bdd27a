/**
 * Heat's status rules for a deployment's result (docs/protocol.md): which outputs are kept, when the
 * revision failed, and the status reason Heat would give. Pure; both stores' callers use it.
 */
import type { ConfigRecord, SignalInput } from './records.js';
import type { StepResult } from './records.js';

/** Heat's status for a signal: FAILED on a non-zero code or a present error_output, else COMPLETE. */
export function heatResult(
  config: ConfigRecord,
  s: SignalInput,
): StepResult & { outputValues: Record<string, unknown> } {
  const outputValues: Record<string, unknown> = {};
  const reasons: string[] = [];
  for (const o of config.outputs) {
    if (!Object.hasOwn(s.outputs, o.name)) continue;
    const v = s.outputs[o.name];
    outputValues[o.name] = v;
    if (o.error_output) reasons.push(`${o.name} : ${typeof v === 'string' ? v : JSON.stringify(v)}`);
  }
  outputValues.deploy_stdout = s.deployStdout;
  outputValues.deploy_stderr = s.deployStderr;
  outputValues.deploy_status_code = s.deployStatusCode;
  if (s.deployStatusCode !== 0)
    reasons.push(`deploy_status_code : Deployment exited with non-zero status code: ${s.deployStatusCode}`);
  const failed = reasons.length > 0;
  const heatReason = failed ? `Deployment to server failed: ${reasons.join(', ')}` : 'Outputs received';
  return { status: failed ? 'FAILED' : 'COMPLETE', statusReason: s.statusReason ?? heatReason, outputValues };
}
