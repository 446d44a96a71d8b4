# An MCP server (the Python SDK's MCPServer) for the Codex CLI's
# `[mcp_servers]` through an exec-server. argv[1]: `stdio`, or `http` to
# serve Streamable HTTP on 127.0.0.1 (a free port printed as `port: N` on
# stdout), every request then needing `Authorization: Bearer $MCP_TEST_SECRET`
# (401 otherwise; each request's verdict appended to argv[2]).
import asyncio, os, socket, sys
from mcp.server.mcpserver import MCPServer

app = MCPServer("codex-mcp-test")

def ancestors():
    """The command lines of this process's ancestors, nearest first."""
    out, pid = [], os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace").strip())
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return out

@app.tool()
def add(a: int, b: int) -> str:
    """a + b, and the processes the server runs under"""
    return f"sum {a + b} under " + " <- ".join(ancestors())

if sys.argv[1] == "stdio":
    app.run()
    sys.exit(0)

import uvicorn
secret = os.environ["MCP_TEST_SECRET"]
log = open(sys.argv[2], "a", buffering=1)
inner = app.streamable_http_app()

async def guarded(scope, receive, send):
    if scope["type"] != "http":
        return await inner(scope, receive, send)
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    ok = headers.get("authorization") == f"Bearer {secret}"
    log.write(f"{scope['method']} {'ok' if ok else 'refused'}\n")
    if not ok:
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"unauthorized"})
        return
    await inner(scope, receive, send)

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(f"port: {sock.getsockname()[1]}", flush=True)
config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
