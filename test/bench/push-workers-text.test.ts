import { describe, expect, it } from 'vitest';
import { type FanoutResult, workersOf } from '../../bench/fanout.js';
import { pushWorkersText } from '../../bench/report.js';

const result = (pushWorkers: number | 'default', counted?: number): FanoutResult =>
  ({
    n: 10,
    pushWorkers,
    runs: [
      {
        controllerRssKb: {
          baseline: 1,
          connected: 2,
          perAgent: 0.1,
          ...(counted === undefined ? {} : { workers: counted }),
        },
      },
    ],
  }) as unknown as FanoutResult;

describe('the push workers a fan-out ran', () => {
  it('are the ones counted in its windows, else what the option or the old default (one) says', () => {
    expect(workersOf(result('default', 3))).toBe(3);
    expect(workersOf(result('default'))).toBe(1);
    expect(workersOf(result(2))).toBe(2);
    expect(workersOf(result(0, 0))).toBe(0);
  });

  it('are named as the default or as the option given', () => {
    expect(pushWorkersText([result('default', 3)])).toBe('default options: 3 push workers, the default on these cores');
    expect(pushWorkersText([result('default')])).toBe('default options: one push worker, the default on these cores');
    expect(pushWorkersText([result(2, 2)])).toBe('`--push-workers 2`: 2 push workers');
    expect(pushWorkersText([result(0, 0)])).toBe('`--push-workers 0`: no push worker');
  });
});
