// The part of Node's node:http2 that src/grpc.js uses, for the type check (tsc -p jsconfig.json): Node's
// own declarations (@types/node) come from the npm registry, out of reach of this project's machines.
declare module "node:http2" {
  type Headers = Record<string, string | string[] | number | undefined>;

  interface ClientHttp2Stream {
    readonly closed: boolean;
    end(data: Uint8Array): void;
    close(code: number): void;
    pause(): this;
    resume(): this;
    isPaused(): boolean;
    on(event: "response" | "trailers", listener: (headers: Headers) => void): this;
    on(event: "data", listener: (chunk: Uint8Array) => void): this;
    on(event: "error", listener: (err: Error) => void): this;
    on(event: "close", listener: () => void): this;
  }

  interface ClientHttp2Session {
    readonly closed: boolean;
    readonly destroyed: boolean;
    request(headers: Headers): ClientHttp2Stream;
    close(): void;
    ref(): void;
    unref(): void;
    on(event: "error", listener: (err: Error) => void): this;
    on(event: "close", listener: () => void): this;
  }

  function connect(authority: string, options?: { settings?: { initialWindowSize?: number } }): ClientHttp2Session;
  const constants: { NGHTTP2_CANCEL: number };

  const http2: { connect: typeof connect; constants: typeof constants };
  export default http2;
  export type { ClientHttp2Session, ClientHttp2Stream };
}
