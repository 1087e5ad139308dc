// A Baton agent in 30 lines of TypeScript, Node.js standard library only.
// The sidecar calls POST /v1/turn with {session, tenant, turnSeq, input,
// state, workspaceDir} and stores the {reply, state} it gets back. The agent
// keeps nothing in the process: every replica answers every session from `state`.
import { appendFileSync } from "node:fs";
import { createServer } from "node:http";
import { AddressInfo } from "node:net";
import { join } from "node:path";

interface Turn { session: string; tenant: string; turnSeq: number; input: string; state: State | null; workspaceDir: string }
interface State { turns: number; said: string[] }

const server = createServer((req, res) => {
  if (req.method !== "POST" || req.url !== "/v1/turn") { res.writeHead(404).end(); return; }
  let body = "";
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    const turn: Turn = JSON.parse(body);
    const state: State = turn.state ?? { turns: 0, said: [] }; // null on the first turn
    state.turns += 1;
    state.said = [...state.said, turn.input].slice(-10);
    // Files left in workspaceDir are stored with the turn, like the state.
    appendFileSync(join(turn.workspaceDir, "notes.md"), `- ${turn.input}\n`);
    const reply = `turn ${state.turns}: you said ${JSON.stringify(turn.input)}; earlier: ${JSON.stringify(state.said.slice(0, -1))}`;
    res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ reply, state }));
  });
});
server.listen(Number(process.env.BATON_AGENT_PORT ?? 8080), "0.0.0.0", () => {
  console.log(`listening on http://127.0.0.1:${(server.address() as AddressInfo).port}`);
});
