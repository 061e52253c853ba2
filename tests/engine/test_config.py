from engine.config import EngineConfig


def test_a_prefill_ahead_pass_is_its_positions_over_a_row_per_32_of_them() -> None:
    """EngineConfig.prefill_ahead_chunk: (positions, requests) of a pass prefilled ahead, at least 8 requests, at most
    max_num_seqs."""

    def chunk(tokens: int, seqs: int) -> tuple[int, int]:
        return EngineConfig(model="m", prefill_ahead_tokens=tokens, max_num_seqs=seqs).prefill_ahead_chunk

    assert chunk(8192, 1024) == (8192, 256)  # issue 16's engine: 91 VoxCPM2 prompts of 90 positions fill a pass
    assert chunk(8192, 64) == (8192, 64)  # the server's default slots
    assert chunk(32768, 1024) == (32768, 1024)
    assert chunk(100, 1024) == (100, 8) and chunk(100, 4) == (100, 4)
