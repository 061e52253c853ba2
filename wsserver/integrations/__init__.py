"""Adapters for voice-agent frameworks, each an optional extra: `pipecat` (`voxstream[pipecat]`) and `livekit`
(`voxstream[livekit]`). Both are thin layers over `wsserver.client`."""
