"""Named volumes: a tenant's persistent directories under a volume root (docs/volumes.md).

The store (records and directories) and a volume's files as the content API reaches them. Used by the API
server's routes (``/v1/volumes``, E2B's ``/volumes`` and ``/volumecontent``); nodes only need the layout
(``adx.model.volume_data_dir``) to hand a volume's directory to sandboxd.
"""

from __future__ import annotations

from adx.volumes._files import EntryStat, VolumeFiles, normalize
from adx.volumes._store import DATA_GID, DATA_UID, VolumeStore

__all__ = ["DATA_GID", "DATA_UID", "EntryStat", "VolumeFiles", "VolumeStore", "normalize"]
