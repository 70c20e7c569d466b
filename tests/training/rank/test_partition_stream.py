"""The image of a partition file that Parquet decodes fetched row groups from (rank/partition_stream.py):
the segments at their offsets and nothing committed elsewhere, however large the file; a host that refuses
the mapping is a MemoryError naming the partition (the rank's OOM verdict), not a traceback of mmap's."""
import errno

import pyarrow as pa
import pytest

from ringflow.training.rank import partition_stream
from ringflow.training.rank.partition_stream import file_image


def test_the_segments_are_at_their_offsets_and_the_rest_reads_zero():
    image = file_image(1000, {10: b"row group 0", 500: b"row group 7"}, "part-00000.parquet")
    reader = pa.BufferReader(image)
    assert len(image) == 1000
    assert reader.read_at(11, 10) == b"row group 0" and reader.read_at(11, 500) == b"row group 7"
    assert reader.read_at(10, 0) == bytes(10) and reader.read_at(5, 995) == bytes(5)


def test_a_file_larger_than_the_host_s_memory_costs_only_its_segments():
    size = 64 * 2**30  # more address space than this host's memory: only the written page is committed
    image = file_image(size, {size - 4096: b"footer"}, "part-00000.parquet")
    assert len(image) == size and pa.BufferReader(image).read_at(6, size - 4096) == b"footer"


def test_a_refused_mapping_is_a_memory_error_that_names_the_partition(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(partition_stream.mmap, "mmap", refuse)
    with pytest.raises(MemoryError, match=r"partition 'part-00003.parquet' .*Cannot allocate memory.*smaller partitions"):
        file_image(2**40, {}, "part-00003.parquet")
