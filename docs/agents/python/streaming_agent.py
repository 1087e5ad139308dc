"""The Python example agent, streaming its reply (agent contract version 2).

As agent.py, but when the request accepts text/event-stream (the sidecar's
always does) the reply goes out word by word as Server-Sent Events, as a
model's tokens would, then a `final` event with {reply, state}. Standard
library only. A client that stops listening (an interrupt) closes the
request: the agent stops writing, and nothing of this turn is committed.
"""
import json, os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Agent(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        if self.path != "/v1/turn":
            return self.send_error(404)
        turn = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        state = turn["state"] or {"turns": 0, "said": []}  # null on the first turn
        state["turns"] += 1
        state["said"] = (state["said"] + [turn["input"]])[-10:]
        with open(os.path.join(turn["workspaceDir"], "notes.md"), "a") as notes:
            notes.write(f"- {turn['input']}\n")
        reply = f"turn {state['turns']}: you said {turn['input']!r}; earlier: {state['said'][:-1]}"
        if "text/event-stream" not in self.headers.get("Accept", ""):
            return self.answer("application/json", json.dumps({"reply": reply, "state": state}).encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")  # the end of the stream is the end of the body
        self.end_headers()
        try:
            self.event("progress", {"name": "thinking"})
            for i, word in enumerate(reply.split(" ")):
                time.sleep(float(os.environ.get("BATON_AGENT_WORD_DELAY", "0.02")))
                self.event("delta", {"text": word if i == 0 else " " + word})
            self.event("final", {"reply": reply, "state": state})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sidecar closed the request (an interrupt): stop writing
        self.close_connection = True

    def event(self, name, data):
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def answer(self, content_type, body):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("BATON_AGENT_PORT", "8080"))), Agent)
print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
server.serve_forever()
