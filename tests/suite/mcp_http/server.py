# An MCP Streamable HTTP server (the Python SDK's MCPServer) on 127.0.0.1,
# a free port printed as `port: N` on stdout. With MCP_TEST_SECRET set,
# every request must carry `Authorization: Bearer <secret>` (else 401).
# argv[1]: a log file, one line per request: `METHOD STATUS SESSION AUTH`
# (SESSION the Mcp-Session-Id it carried or `-`, AUTH `ok`/`none`/`bad`).
import asyncio, os, socket, sys
import uvicorn
from mcp.server.mcpserver import MCPServer, Context

secret = os.environ.get("MCP_TEST_SECRET")
log = open(sys.argv[1], "a", buffering=1)
app = MCPServer("executor-http-test")

@app.tool()
def add(a: int, b: int) -> int:
    """a + b"""
    return a + b

@app.tool()
async def progress(steps: int, ctx: Context) -> str:
    """reports progress steps times, 50 ms apart"""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
        await asyncio.sleep(0.05)
    return f"done {steps}"

@app.tool()
async def ticker(ctx: Context) -> str:
    """reports progress every 200 ms, forever"""
    i = 0
    while True:
        i += 1
        await ctx.report_progress(i, None, f"tick {i}")
        await asyncio.sleep(0.2)

@app.tool()
def pid() -> int:
    return os.getpid()

@app.resource("test://greeting")
def greeting() -> str:
    return "hello from behind the host"

inner = app.streamable_http_app()

async def guarded(scope, receive, send):
    if scope["type"] != "http":
        return await inner(scope, receive, send)
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    got = headers.get("authorization")
    auth = "none" if got is None else ("ok" if got == f"Bearer {secret}" else "bad")
    session = headers.get("mcp-session-id", "-")
    status = []
    async def sending(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
            log.write(f"{scope['method']} {message['status']} {session} {auth}\n")
        await send(message)
    if secret is not None and auth != "ok":
        await sending({"type": "http.response.start", "status": 401,
                       "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"unauthorized"})
        return
    await inner(scope, receive, sending)

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
# Listening before the port is told: a connection waits in the backlog
# until uvicorn serves it, never refused.
sock.listen(128)
print(f"port: {sock.getsockname()[1]}", flush=True)
config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
