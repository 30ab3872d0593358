"""manifest.json: the file that makes a stored checkpoint or model artifact exist.

Written last under the artifact's prefix by `whetstone.runtime.checkpoints.upload_checkpoint`;
read by every service that downloads or registers an artifact (trainer-agent, eval, registry,
serving). Besides `files` it carries what its writer recorded about it (job, tenant, step ...)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ManifestFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int | None = Field(default=None, ge=0)


class ArtifactManifest(BaseModel):
    """Every file of the artifact (relative path -> sha256 and size) and its writer's fields."""

    model_config = ConfigDict(frozen=True, extra="allow")

    files: dict[str, ManifestFile]
    job_id: str | None = None

    def sha256s(self) -> dict[str, str]:
        """{relative path: sha256}, sorted by path."""
        return {rel: entry.sha256 for rel, entry in sorted(self.files.items())}

    def sizes(self) -> dict[str, int]:
        """{relative path: size in bytes} (0 where the writer recorded none)."""
        return {rel: entry.size or 0 for rel, entry in self.files.items()}
