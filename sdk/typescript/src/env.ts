/**
 * Where the SDK finds the cluster when it is not told: the variables `dex-ha cluster up`
 * writes to tokens.env (the same ones the Python SDK reads). An argument always wins.
 */

export const URLS_VAR = "DEX_HA_URLS";
export const TOKEN_VAR = "DEX_HA_TOKEN";
export const CLIENT_TOKEN_VAR = "DEX_HA_CLIENT_TOKEN";
export const WORKER_TOKEN_VAR = "DEX_HA_WORKER_TOKEN";
export const NAMESPACE_VAR = "DEX_HA_NAMESPACE";
/** Where `dex-ha dev` listens. */
export const DEFAULT_URL = "http://127.0.0.1:8801";

type Environ = Record<string, string | undefined>;

/** The URLs of a comma-separated list, blanks dropped. */
export function splitUrls(text: string): string[] {
  return text
    .split(",")
    .map((part) => part.trim())
    .filter((part) => part.length > 0);
}

export function urlsFromEnv(environ: Environ = process.env): string[] {
  const urls = splitUrls(environ[URLS_VAR] ?? "");
  return urls.length > 0 ? urls : [DEFAULT_URL];
}

/** The first of the variables `names` that is set and not blank, else null. */
export function tokenFromEnv(names: string[], environ: Environ = process.env): string | null {
  for (const name of names) {
    const value = (environ[name] ?? "").trim();
    if (value) return value;
  }
  return null;
}

export function namespaceFromEnv(environ: Environ = process.env): string | null {
  return tokenFromEnv([NAMESPACE_VAR], environ);
}
