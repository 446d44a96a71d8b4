# A small MCP stdio server (the Python SDK's MCPServer, FastMCP before 2.x).
import asyncio, os, socket, sys
try:
    from mcp.server.mcpserver import MCPServer as Server, Context
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server, Context

app = Server("executor-test")
print("test-server: started", file=sys.stderr, flush=True)

@app.tool()
def add(a: int, b: int) -> int:
    """a + b"""
    return a + b

@app.tool()
def big(n: int) -> str:
    """n bytes of text"""
    return "".join(chr(ord("a") + i % 26) for i in range(n))

@app.tool()
async def progress(steps: int, ctx: Context) -> str:
    """reports progress steps times"""
    for i in range(steps):
        await ctx.report_progress(i + 1, steps, f"step {i + 1}")
    return f"done {steps}"

@app.tool()
def crash() -> str:
    """dies mid-call"""
    os._exit(3)

@app.tool()
def write_file(path: str) -> str:
    try:
        with open(path, "w") as f:
            f.write("x")
        return "wrote"
    except OSError as e:
        return f"error: {e}"

@app.tool()
def connect(host: str, port: int) -> str:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "connected"
    except OSError as e:
        return f"error: {e}"

@app.tool()
def pid() -> int:
    return os.getpid()

@app.tool()
async def numbered(count: int, delay: float, ctx: Context) -> str:
    """count progress notifications numbered 1..count, delay seconds apart"""
    for i in range(count):
        await ctx.report_progress(i + 1, count)
        await asyncio.sleep(delay)
    return f"done {count}"

# The JSON-RPC ids of the `tick` requests this server received.
TICKS = []

@app.tool()
def tick(ctx: Context) -> int:
    """records its request's id; returns how many ticks came so far"""
    TICKS.append(ctx.request_id)
    return len(TICKS)

@app.tool()
def ticks() -> str:
    """`received distinct` of the tick requests"""
    return f"{len(TICKS)} {len(set(TICKS))}"

@app.resource("test://greeting")
def greeting() -> str:
    return "hello from the host"

app.run()
