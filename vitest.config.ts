import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    pool: 'forks',
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // integration suites start real processes: keep the 2-core machine from thrashing
    maxWorkers: 2,
  },
});
