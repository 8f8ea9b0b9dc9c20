"""What the verifier checks of Icechunk's flatbuffers: the tables and fields the reader uses,
transcribed from icechunk-format/flatbuffers/*.fbs (the schemas fbs/ was generated from;
tests/unit/refs/icechunk checks each slot against the generated accessors). Spec version 2
only adds fields to version 1's tables, so one description serves both."""

from __future__ import annotations

from refmount.refs.icechunk.verify import Field, Table

ID12, ID8 = 12, 8
MANIFEST_FILE_INFO = 32  # struct {ObjectId12 id; uint64 size_bytes; uint32 num_chunk_refs} (aligned to 8)
CHUNK_INDEX_RANGE = 8  # struct {uint32 from; uint32 to}
DIMENSION_SHAPE = 16  # struct {uint64 array_length; uint64 chunk_length}

# ---- manifest.fbs
CHUNK_REF = Table("ChunkRef", {
    "index": Field(0, "vector", 4, required=True),
    "inline": Field(1, "vector", 1),
    "offset": Field(2, "scalar", 8),
    "length": Field(3, "scalar", 8),
    "chunk_id": Field(4, "struct", ID12),
    "location": Field(5, "string"),
    "checksum_etag": Field(6, "string"),
    "checksum_last_modified": Field(7, "scalar", 4),
    "compressed_location": Field(8, "vector", 1),
}, exactly_one=("inline", "chunk_id", "location|compressed_location"), keep=("index",))
ARRAY_MANIFEST = Table("ArrayManifest", {
    "node_id": Field(0, "struct", ID8, required=True),
    "refs": Field(1, "tables", required=True, table=CHUNK_REF),
})
MANIFEST = Table("Manifest", {
    "id": Field(0, "struct", ID12, required=True),
    "arrays": Field(1, "tables", required=True, table=ARRAY_MANIFEST),
    "location_dictionary": Field(2, "vector", 1),
    "compression_algorithm": Field(3, "scalar", 1),
})

# ---- snapshot.fbs
MANIFEST_REF = Table("ManifestRef", {
    "object_id": Field(0, "struct", ID12, required=True),
    "extents": Field(1, "vector", CHUNK_INDEX_RANGE, required=True),
})
DIMENSION_SHAPE_V2 = Table("DimensionShapeV2", {
    "array_length": Field(0, "scalar", 8),
    "num_chunks": Field(1, "scalar", 4),
})
ARRAY_NODE_DATA = Table("ArrayNodeData", {
    "shape": Field(0, "vector", DIMENSION_SHAPE, required=True),
    "manifests": Field(2, "tables", required=True, table=MANIFEST_REF),
    "shape_v2": Field(3, "tables", table=DIMENSION_SHAPE_V2),
})
GROUP_NODE_DATA = Table("GroupNodeData", {})
NODE_ARRAY, NODE_GROUP = 1, 2
NODE_SNAPSHOT = Table("NodeSnapshot", {
    "id": Field(0, "struct", ID8, required=True),
    "path": Field(1, "string", required=True),
    "user_data": Field(2, "vector", 1, required=True),
    "node_data": Field(4, "union", required=True,
                       union={NODE_ARRAY: ARRAY_NODE_DATA, NODE_GROUP: GROUP_NODE_DATA}),
})
MANIFEST_FILE_INFO_V2 = Table("ManifestFileInfoV2", {
    "id": Field(0, "struct", ID12),
    "size_bytes": Field(1, "scalar", 8),
    "num_chunk_refs": Field(2, "scalar", 4),
})
SNAPSHOT = Table("Snapshot", {
    "id": Field(0, "struct", ID12, required=True),
    "parent_id": Field(1, "struct", ID12),
    "nodes": Field(2, "tables", required=True, table=NODE_SNAPSHOT),
    "flushed_at": Field(3, "scalar", 8),
    "message": Field(4, "string", required=True),
    "manifest_files": Field(6, "vector", MANIFEST_FILE_INFO, required=True),
    "manifest_files_v2": Field(7, "tables", table=MANIFEST_FILE_INFO_V2),
})

# ---- repo.fbs
REF = Table("Ref", {
    "name": Field(0, "string", required=True),
    "snapshot_index": Field(1, "scalar", 4),
})
SNAPSHOT_INFO = Table("SnapshotInfo", {
    "id": Field(0, "struct", ID12, required=True),
    "parent_offset": Field(1, "scalar", 4),
    "flushed_at": Field(2, "scalar", 8),
    "message": Field(3, "string", required=True),
})
REPO = Table("Repo", {
    "spec_version": Field(0, "scalar", 1),
    "tags": Field(1, "tables", required=True, table=REF),
    "branches": Field(2, "tables", required=True, table=REF),
    "deleted_tags": Field(3, "strings", required=True),
    "snapshots": Field(4, "tables", required=True, table=SNAPSHOT_INFO),
    "config": Field(9, "vector", 1),
})
