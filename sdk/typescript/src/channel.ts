/**
 * The Worker's end of the Worker channel: one WebSocket to the active node (JSON frames),
 * kept open across failovers, batching what the Worker sends.
 *
 * ChannelLink knows frames, not tasks: the Worker hands it reports, deltas and credit, and
 * gets tasks, acks and cancels back through a ChannelPeer. Reports stay in `unacked` until
 * their ack comes; after a reconnect they are sent again (a result that did commit is
 * answered 200 again, a failure 409: both settle it).
 */
import type WebSocket from "ws";
import { type Connection, sleep } from "./connection.js";
import { DexError } from "./errors.js";
import type { Failpoints } from "./failpoints.js";
import {
  type Ack,
  CHANNEL_PATH,
  CLOSE_NOT_ACTIVE,
  MAX_BATCH,
  type Report,
  type ServerFrame,
  type WorkerFrameParts,
  decodeFrame,
  encodeFrame,
} from "./protocol.js";

/** After a delta, wait this long before the frame that carries it (a burst travels in one). */
export const DELTA_BATCH_MS = 30;
/** Ping the node this often; no pong by the next ping: the connection is dead, reconnect. */
export const PING_MS = 5_000;

/** The node has no channel for this Worker (an older server: 404; a proxy that drops the
 * upgrade: 400). */
export class ChannelRefused extends Error {
  constructor(readonly error: DexError) {
    super(`the node has no Worker channel: ${error.message}`);
    this.name = "ChannelRefused";
  }
}

/** What the link asks of the Worker. */
export interface ChannelPeer {
  freeSlots(): number;
  onTasks(tasks: unknown[]): void;
  onAck(report: Report, ack: Ack): void;
  onCancel(taskToken: string, reason: string): void;
  /** A channel opened; `held`: the tasks the node still counts as this Worker's. */
  onWelcome(held: string[]): void;
}

export class ChannelLink {
  private reports: Report[] = []; // to send
  private readonly unacked = new Map<string, Report>(); // sent, no ack yet
  private readonly deltas = new Map<string, Record<string, unknown>[]>();
  private credit = 0;
  private tasksSeq = 0; // the last `tasks` frame received
  private ackSent = 0;
  private ws: WebSocket | null = null;
  private welcomed = false;
  private closing = false;
  private flushTimer: NodeJS.Timeout | null = null;
  private flushImmediate: NodeJS.Immediate | null = null;
  private ackWaiters: Array<() => void> = [];
  private closedResolve: () => void = () => {};
  private readonly closed = new Promise<void>((resolve) => (this.closedResolve = resolve));
  /** Channels opened so far (1 + reconnects). */
  sessions = 0;

  constructor(
    private readonly conn: Connection,
    readonly workerId: string,
    private readonly agents: string[],
    private readonly peer: ChannelPeer,
    private readonly failpoints: Failpoints,
    private readonly stopping: () => boolean,
  ) {}

  // ------------------------------------------------------------ what the Worker sends

  /** Queue a report (and the slot it frees); it goes in the next frame. */
  report(report: Report, credit = 0): void {
    this.reports.push(report);
    this.credit += credit;
    this.wake();
  }

  addCredit(n: number): void {
    this.credit += n;
    this.wake();
  }

  sendDeltas(taskToken: string, deltas: Record<string, unknown>[]): void {
    const queued = this.deltas.get(taskToken);
    if (queued) queued.push(...deltas);
    else this.deltas.set(taskToken, [...deltas]);
    this.wake();
  }

  /** Reports not acknowledged yet (queued or sent). */
  get outstanding(): number {
    return this.reports.length + this.unacked.size;
  }

  /** Wait until every report was acknowledged, for up to `timeoutMs`. */
  async settle(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.outstanding > 0 && Date.now() < deadline) {
      await Promise.race([new Promise<void>((resolve) => this.ackWaiters.push(resolve)), sleep(deadline - Date.now())]);
    }
    if (this.outstanding > 0) {
      this.conn.logger.warn(`worker ${this.workerId}: ${this.outstanding} reports not acknowledged when it stopped`);
    }
  }

  // ------------------------------------------------------------ lifetime

  /** Open the channel and keep it open (reconnecting, following the active node) until
   * close(). Throws ChannelRefused when the node has no channel, DexError for a 401/403. */
  async run(): Promise<void> {
    const params = { worker_id: this.workerId, agents: this.agents.join(","), encoding: "json" };
    let failures = 0;
    while (!this.closing) {
      const opening = this.conn.openWebSocket(CHANNEL_PATH, params);
      let ws: WebSocket | null;
      try {
        ws = await Promise.race([opening, this.closed.then(() => null)]);
      } catch (exc) {
        if (exc instanceof DexError && (exc.status === 400 || exc.status === 404)) throw new ChannelRefused(exc);
        throw exc;
      }
      if (ws === null) {
        opening.then((late) => late.close(1000), () => {});
        return;
      }
      this.sessions += 1;
      const code = await this.session(ws);
      if (this.closing) return;
      if (code === CLOSE_NOT_ACTIVE) {
        this.conn.logger.info(`worker ${this.workerId}: the node is no longer active; reconnecting to the active one`);
        failures = 0;
      } else {
        this.conn.logger.warn(`worker ${this.workerId}: channel closed (code ${code}); reconnecting`);
        await sleep(this.conn.retryDelayMs(failures));
        failures += 1;
      }
    }
  }

  /** Close the channel for good (a stopped Worker). */
  close(): void {
    this.closing = true;
    this.closedResolve();
    this.ws?.close(1000, "the Worker stopped");
  }

  /** One open channel: read what comes, send what is queued, until it closes. */
  private session(ws: WebSocket): Promise<number> {
    this.ws = ws;
    this.welcomed = false;
    let alive = true;
    const pinger = setInterval(() => {
      if (!alive) {
        this.conn.logger.warn(`worker ${this.workerId}: no pong from the node; dropping the channel`);
        ws.terminate();
        return;
      }
      alive = false;
      ws.ping();
    }, PING_MS);
    ws.on("pong", () => (alive = true));
    ws.on("message", (data, isBinary) => {
      alive = true;
      try {
        if (isBinary) throw new Error("this channel speaks JSON: frames must be text messages");
        const frame = decodeFrame(data.toString());
        if (frame !== null) this.onFrame(frame); // null: a type from a newer node, ignored
      } catch (exc) {
        this.conn.logger.error(
          `worker ${this.workerId}: a frame from the node does not fit the protocol (${String(exc)}); reconnecting`,
        );
        ws.close(1000);
      }
    });
    ws.on("error", (exc) => this.conn.logger.warn(`worker ${this.workerId}: channel error: ${exc.message}`));
    const closed = new Promise<number>((resolve) => {
      ws.on("close", (code) => {
        clearInterval(pinger);
        this.ws = null;
        this.welcomed = false;
        resolve(code);
      });
    });
    ws.resume();
    return closed;
  }

  private onFrame(frame: ServerFrame): void {
    switch (frame.type) {
      case "welcome":
        // The node's credit for this Worker starts at 0 with each channel; reports it may
        // not have seen go again.
        this.welcomed = true;
        this.peer.onWelcome(frame.held);
        this.credit = this.stopping() ? 0 : this.peer.freeSlots();
        this.reports = [...this.unacked.values(), ...this.reports];
        this.unacked.clear();
        this.wake();
        break;
      case "tasks":
        this.tasksSeq = Math.max(this.tasksSeq, frame.seq);
        this.peer.onTasks(frame.tasks);
        break;
      case "acks":
        for (const ack of frame.acks) this.onAck(ack);
        break;
      case "cancel":
        this.peer.onCancel(frame.task_token, frame.reason);
        break;
    }
  }

  private onAck(ack: Ack): void {
    const waiters = this.ackWaiters;
    this.ackWaiters = [];
    waiters.forEach((resolve) => resolve());
    const report = this.unacked.get(ack.task_token);
    if (report === undefined) return; // an ack of a report sent again meanwhile
    this.unacked.delete(ack.task_token);
    if (ack.status === 503) {
      // Not committed: send it again after a pause.
      setTimeout(() => {
        if (!this.closing) this.report(report);
      }, this.conn.retryDelayMs(1));
      return;
    }
    this.peer.onAck(report, ack);
  }

  /** Send soon: what else finishes in this turn of the event loop joins the frame; deltas
   * alone wait DELTA_BATCH_MS so a burst travels in one frame. */
  private wake(): void {
    if (this.ws === null || !this.welcomed) return;
    if (this.reports.length || this.credit) {
      if (this.flushImmediate === null) this.flushImmediate = setImmediate(() => this.flush());
    } else if (this.deltas.size && this.flushTimer === null && this.flushImmediate === null) {
      this.flushTimer = setTimeout(() => this.flush(), DELTA_BATCH_MS);
    }
  }

  private flush(): void {
    if (this.flushTimer !== null) clearTimeout(this.flushTimer);
    if (this.flushImmediate !== null) clearImmediate(this.flushImmediate);
    this.flushTimer = this.flushImmediate = null;
    const ws = this.ws;
    if (ws === null || !this.welcomed) return;
    const frame = this.takeFrame();
    if (frame === null) return;
    if (frame.reports.length) this.failpoints.hit("worker.channel.before-results");
    ws.send(encodeFrame(frame));
    if (this.reports.length || this.deltas.size) this.wake();
  }

  private takeFrame(): WorkerFrameParts | null {
    const reports = this.reports.splice(0, MAX_BATCH);
    const tokens = [...this.deltas.keys()].slice(0, MAX_BATCH);
    const deltas = tokens.map((token) => {
      const entry = { task_token: token, deltas: this.deltas.get(token)! };
      this.deltas.delete(token);
      return entry;
    });
    const credit = this.credit;
    this.credit = 0;
    if (!reports.length && !deltas.length && !credit && this.tasksSeq <= this.ackSent) return null;
    for (const report of reports) this.unacked.set(report.task_token, report);
    this.ackSent = this.tasksSeq;
    return { reports, deltas, credit, ack: this.tasksSeq };
  }
}
