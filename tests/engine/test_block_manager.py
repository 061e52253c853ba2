from engine.block_manager import BlockManager
from tests.engine.helpers import make_seq


def test_allocate_reserves_prompt_plus_cap():
    manager = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq("a", num_prompt=5)
    seq.max_patches = 4  # 5 + 4 - 1 = 8 positions -> 2 blocks
    assert manager.can_allocate(seq)
    manager.allocate(seq)
    assert len(seq.block_table) == 2
    assert manager.num_free_blocks == 8


def test_cannot_allocate_past_the_pool():
    manager = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq("a", num_prompt=5)
    seq.max_patches = 5  # 9 positions -> 3 blocks
    assert not manager.can_allocate(seq)


def test_deallocate_returns_every_block():
    manager = BlockManager(num_blocks=6, block_size=4)
    seqs = [make_seq(str(i), num_prompt=3) for i in range(3)]
    for seq in seqs:
        seq.max_patches = 3
        manager.allocate(seq)
    owned = [b for seq in seqs for b in seq.block_table]
    assert len(owned) == len(set(owned)) == 6
    assert manager.num_free_blocks == 0
    for seq in seqs:
        manager.deallocate(seq)
        assert seq.block_table == [] and seq.num_cached == 0
    assert sorted(manager.free_block_ids) == list(range(6))
