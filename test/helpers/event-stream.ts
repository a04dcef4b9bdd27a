/**
 * A test's reader of `GET /v1/events` (Server-Sent Events) with a client certificate: every
 * event with the time it arrived, and a way to wait for one.
 */
import https from 'node:https';
import type { Cred } from './procs.js';

export interface ReceivedEvent {
  event: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  data: any;
  /** Date.now() when it arrived. */
  at: number;
}

export interface EventReader {
  events: ReceivedEvent[];
  /** Resolves once the stream is open (the server sent its first bytes). */
  opened: Promise<void>;
  /** Resolves when the server ends the stream (or the connection closes). */
  ended: Promise<void>;
  close(): void;
}

export function readEvents(port: number, c: Cred): EventReader {
  const events: ReceivedEvent[] = [];
  let open: () => void = () => undefined;
  const opened = new Promise<void>((r) => {
    open = r;
  });
  let end: () => void = () => undefined;
  const ended = new Promise<void>((r) => {
    end = r;
  });
  const req = https.request(
    {
      host: '127.0.0.1',
      port,
      method: 'GET',
      path: '/v1/events',
      ca: c.ca,
      cert: c.cert,
      key: c.key,
      servername: 'localhost',
      agent: false,
      headers: { accept: 'text/event-stream' },
    },
    (res) => {
      res.setEncoding('utf8');
      let buf = '';
      res.on('data', (chunk: string) => {
        open();
        buf += chunk;
        for (let i = buf.indexOf('\n\n'); i !== -1; i = buf.indexOf('\n\n')) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let event = 'message';
          const data: string[] = [];
          for (const line of block.split('\n')) {
            if (line.startsWith('event: ')) event = line.slice(7);
            else if (line.startsWith('data: ')) data.push(line.slice(6));
          }
          if (data.length === 0) continue;
          let parsed: unknown;
          try {
            parsed = JSON.parse(data.join('\n'));
          } catch {
            parsed = data.join('\n');
          }
          events.push({ event, data: parsed, at: Date.now() });
        }
      });
      res.on('error', () => undefined);
      res.on('end', () => end());
      res.on('close', () => end());
    },
  );
  req.on('error', () => end());
  req.end();
  return { events, opened, ended, close: () => req.destroy() };
}
