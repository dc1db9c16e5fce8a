/**
 * A session's history as a model API must see it: the same rules as the Python SDK's
 * `dex_ha.models.openai.model_order` and `transcript`, so an agent sees the same
 * conversation whichever language its Worker is written in.
 */
import type { HistoryItem } from "../model.js";

export const MISSING_RESULT = "No result is recorded for this call.";
export const SUMMARY_INSTRUCTIONS =
  "You compress a conversation between a user and an AI assistant that uses tools, so that the " +
  "assistant can go on without the full text. Write a concise summary that keeps every fact, " +
  "decision, commitment, open question and tool result that may matter later, including ids, " +
  "names, numbers and which tool calls already ran (they must not be repeated). Answer with the " +
  "summary only.";

export interface OrderedCall {
  id: string;
  name: string;
  arguments: Record<string, unknown>;
  output: string;
}

export type Entry =
  | { type: "user"; text: string }
  | { type: "note"; text: string }
  | { type: "assistant"; content: string; calls: OrderedCall[] };

/**
 * Every assistant message directly followed by the results of its calls, in the order of
 * the calls. Model APIs refuse an input where anything stands between a call and its
 * result, a call without a result, or a result without its call: so a call with no result
 * gets MISSING_RESULT, a note or message that came between them comes after, and a result
 * whose call is not in the history becomes a note.
 */
export function modelOrder(history: HistoryItem[]): Entry[] {
  const results = new Map<unknown, HistoryItem>();
  for (const item of history) if (item?.type === "tool_result") results.set(item.call_id, item);
  const answered = new Set<unknown>();
  const entries: Entry[] = [];
  for (const item of history) {
    const kind = item !== null && typeof item === "object" ? item.type : undefined;
    if (kind === "user" || kind === "note") {
      entries.push({ type: kind, text: text(item.text) });
    } else if (kind === "assistant") {
      const calls = (item.tool_calls ?? []).map((call: HistoryItem) => {
        const result = results.get(call.id);
        if (result !== undefined) answered.add(call.id);
        return {
          id: call.id,
          name: call.name,
          arguments: call.arguments ?? {},
          output: result === undefined ? MISSING_RESULT : resultText(result),
        };
      });
      entries.push({ type: "assistant", content: text(item.content), calls });
    } else if (kind === "tool_result") {
      if (!answered.has(item.call_id)) {
        entries.push({
          type: "note",
          text: `The result of an earlier call of ${item.name} (call ${item.call_id}): ${resultText(item)}`,
        });
      }
    } else {
      // An item type this version does not know: show it rather than lose it.
      entries.push({ type: "note", text: JSON.stringify(item) });
    }
  }
  return entries;
}

/** What the model reads as a call's output: the tool's output (a string as is, anything
 * else as JSON), or its status and error when it did not succeed. */
export function resultText(result: HistoryItem): string {
  if (result.status === "succeeded") {
    return typeof result.output === "string" ? result.output : JSON.stringify(result.output ?? null);
  }
  return JSON.stringify({ status: result.status ?? null, error: result.error ?? null });
}

/** The history (after the summary) as plain text, for the summary call: as text the model
 * cannot mistake it for a conversation to carry on, nor call its tools. */
export function transcript(history: HistoryItem[], summary: string | null): string {
  const lines = summary ? [`Summary of the conversation before this part:\n${summary}\n`] : [];
  for (const entry of modelOrder(history)) {
    if (entry.type === "user") lines.push(`User: ${entry.text}`);
    else if (entry.type === "note") lines.push(`Note: ${entry.text}`);
    else {
      if (entry.content) lines.push(`Assistant: ${entry.content}`);
      for (const call of entry.calls) {
        lines.push(`Assistant called ${call.name} (call ${call.id}) with ${JSON.stringify(call.arguments)}`);
        lines.push(`Result of call ${call.id}: ${call.output}`);
      }
    }
  }
  return lines.join("\n");
}

export function summaryText(summary: string): string {
  return `Summary of the conversation before the messages below:\n${summary}`;
}

function text(value: unknown): string {
  return typeof value === "string" ? value : value === null || value === undefined ? "" : JSON.stringify(value);
}
