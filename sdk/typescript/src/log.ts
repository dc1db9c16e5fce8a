/** What the SDK logs through: `console` by default; pass your own (pino, winston) as `logger`. */
export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

const stamp = (): string => new Date().toISOString();

export const defaultLogger: Logger = {
  debug: () => {},
  info: (message) => console.error(`${stamp()} ${process.pid} dex-ha ${message}`),
  warn: (message) => console.error(`${stamp()} ${process.pid} dex-ha WARNING ${message}`),
  error: (message) => console.error(`${stamp()} ${process.pid} dex-ha ERROR ${message}`),
};
