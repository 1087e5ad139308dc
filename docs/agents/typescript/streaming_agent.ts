// The TypeScript example agent, streaming its reply (agent contract
// version 2), Node.js standard library only. As agent.ts, but when the
// request accepts text/event-stream (the sidecar's always does) the reply
// goes out word by word as Server-Sent Events, as a model's tokens would,
// then a `final` event with {reply, state}. A client that stops listening
// (an interrupt) closes the request: the agent stops writing, and nothing
// of this turn is committed.
import { appendFileSync } from "node:fs";
import { createServer, ServerResponse } from "node:http";
import { AddressInfo } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

interface Turn { session: string; tenant: string; turnSeq: number; input: string; state: State | null; workspaceDir: string }
interface State { turns: number; said: string[] }

const wordDelayMs = Number(process.env.BATON_AGENT_WORD_DELAY_MS ?? 20);

function event(res: ServerResponse, name: string, data: unknown): void {
  res.write(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
}

async function stream(res: ServerResponse, reply: string, state: State): Promise<void> {
  res.writeHead(200, { "Content-Type": "text/event-stream" });
  event(res, "progress", { name: "thinking" });
  const words = reply.split(" ");
  for (let i = 0; i < words.length; i++) {
    await sleep(wordDelayMs);
    if (res.destroyed) return; // the sidecar closed the request (an interrupt): stop writing
    event(res, "delta", { text: i === 0 ? words[i] : " " + words[i] });
  }
  event(res, "final", { reply, state });
  res.end();
}

const server = createServer((req, res) => {
  if (req.method !== "POST" || req.url !== "/v1/turn") { res.writeHead(404).end(); return; }
  let body = "";
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    const turn: Turn = JSON.parse(body);
    const state: State = turn.state ?? { turns: 0, said: [] }; // null on the first turn
    state.turns += 1;
    state.said = [...state.said, turn.input].slice(-10);
    appendFileSync(join(turn.workspaceDir, "notes.md"), `- ${turn.input}\n`);
    const reply = `turn ${state.turns}: you said ${JSON.stringify(turn.input)}; earlier: ${JSON.stringify(state.said.slice(0, -1))}`;
    if ((req.headers.accept ?? "").includes("text/event-stream")) {
      void stream(res, reply, state);
    } else {
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ reply, state }));
    }
  });
});
server.listen(Number(process.env.BATON_AGENT_PORT ?? 8080), "0.0.0.0", () => {
  console.log(`listening on http://127.0.0.1:${(server.address() as AddressInfo).port}`);
});
