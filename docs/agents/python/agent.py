"""A Baton agent in 30 lines of Python, standard library only.

The sidecar calls POST /v1/turn with {session, tenant, turnSeq, input, state,
workspaceDir} and stores the {reply, state} it gets back. The agent keeps
nothing in the process: every replica answers every session from `state`.
"""
import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Agent(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/v1/turn":
            return self.send_error(404)
        turn = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        state = turn["state"] or {"turns": 0, "said": []}  # null on the first turn
        state["turns"] += 1
        state["said"] = (state["said"] + [turn["input"]])[-10:]
        # Files left in workspaceDir are stored with the turn, like the state.
        with open(os.path.join(turn["workspaceDir"], "notes.md"), "a") as notes:
            notes.write(f"- {turn['input']}\n")
        reply = f"turn {state['turns']}: you said {turn['input']!r}; earlier: {state['said'][:-1]}"
        body = json.dumps({"reply": reply, "state": state}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("BATON_AGENT_PORT", "8080"))), Agent)
print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
server.serve_forever()
