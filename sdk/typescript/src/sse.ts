/**
 * A Server-Sent Events parser (text/event-stream). Fed text as it arrives, it returns each
 * complete event. Only what dex-ha uses is kept: id, event and data; comments (keep-alives)
 * and retry are ignored. Unlike a browser, an event's id is the id of that event only (a
 * live delta has none), because a client must tell committed events from deltas.
 */

export interface RawEvent {
  id: string | null;
  event: string;
  data: string;
}

export class SSEParser {
  private pending = "";
  private id: string | null = null;
  private event = "";
  private data: string[] = [];
  private hasFields = false;

  feed(text: string): RawEvent[] {
    const all = this.pending + text;
    const events: RawEvent[] = [];
    const lineEnd = /\r\n|\r|\n/g;
    let start = 0;
    for (let match = lineEnd.exec(all); match !== null; match = lineEnd.exec(all)) {
      if (match[0] === "\r" && match.index + 1 === all.length) break; // maybe half of "\r\n"
      const event = this.line(all.slice(start, match.index));
      start = match.index + match[0].length;
      if (event !== null) events.push(event);
    }
    this.pending = all.slice(start);
    return events;
  }

  private line(line: string): RawEvent | null {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") this.data.push(value);
    else if (name === "event") this.event = value;
    else if (name === "id") {
      if (!value.includes("\0")) this.id = value;
    } else return null;
    this.hasFields = true;
    return null;
  }

  private dispatch(): RawEvent | null {
    if (!this.hasFields) return null;
    const event = { id: this.id, event: this.event || "message", data: this.data.join("\n") };
    this.id = null;
    this.event = "";
    this.data = [];
    this.hasFields = false;
    return event.data || event.id !== null ? event : null;
  }
}
