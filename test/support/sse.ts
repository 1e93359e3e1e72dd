/**
 * Reading `GET /jobs/{id}/events` in tests: the response body parsed by eventsource-parser (the
 * maintained parser the CLI uses too), as an async iterator of events, or collected to the end.
 */
import { createParser, type EventSourceMessage } from 'eventsource-parser';

/** One parsed event; `json` is its data parsed. */
export interface SseEvent {
  id: string | undefined;
  event: string;
  data: string;
  json: any;
}

/** Events of a response body as they arrive; comments (`: ping`) go to `onComment`. */
export async function* sseEvents(res: Response, onComment?: (c: string) => void): AsyncGenerator<SseEvent> {
  if (!res.body) return;
  const queue: SseEvent[] = [];
  const parser = createParser({
    onEvent: (m: EventSourceMessage) => queue.push({ id: m.id, event: m.event ?? 'message', data: m.data, json: JSON.parse(m.data) }),
    ...(onComment ? { onComment } : {}),
  });
  const decoder = new TextDecoder();
  const reader = res.body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      while (queue.length > 0) yield queue.shift()!;
    }
    while (queue.length > 0) yield queue.shift()!;
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** Every event until the server ends the stream. */
export async function allEvents(res: Response): Promise<SseEvent[]> {
  const out: SseEvent[] = [];
  for await (const e of sseEvents(res)) out.push(e);
  return out;
}

/** The concatenated text of a stream's output events. */
export function textOf(events: SseEvent[], stream: 'stdout' | 'stderr'): string {
  return events.filter((e) => e.event === stream).map((e) => e.json.data as string).join('');
}
