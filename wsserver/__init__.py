"""The ttsws/1 WebSocket server (docs/protocol.md): a sans-I/O protocol core and a websockets + uvloop adapter."""
