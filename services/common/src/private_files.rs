//! The state directory's files are the mesh's own: the ledger's and the API keys'
//! databases, Temporal's, transcripts, logs. Each is made readable by its owner only
//! (files 0600, directories 0700), whatever the umask the service was started with:
//! they were 0644 under the usual 022, so any user of the host read every fork's
//! spending and every key's hash.

use std::{
    io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Create `dir` as a directory only its owner may enter (its missing parents as the
/// umask makes them); one that exists is left as it is, since the provisioner makes
/// the state directory searchable by the sandboxes' uids.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        done => done,
    }
}

/// Make the SQLite database at `path` readable by its owner only: created empty with
/// mode 0600 when missing (SQLite takes an empty file as a new database, and gives its
/// `-wal`, `-shm` and `-journal` files the database's mode), narrowed to 0600 when it
/// is there, with those files beside it.
pub fn private_sqlite_file(path: &Path) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    for file in std::iter::once(path.to_owned()).chain(sidecars(path)) {
        match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// SQLite's own files beside a database.
fn sidecars(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    ["-wal", "-shm", "-journal"].into_iter().map(|suffix| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_new_directory_is_its_owners_and_an_existing_one_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/state");
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o711, "the provisioner's o+x undone");
    }

    #[test]
    fn a_database_and_its_sidecars_are_narrowed_to_their_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("ledger.db");
        private_sqlite_file(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        assert_eq!(std::fs::metadata(&db).unwrap().len(), 0);
        // What an earlier version left: world-readable.
        let wal = tmp.path().join("ledger.db-wal");
        for p in [&db, &wal] {
            std::fs::write(p, b"x").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        private_sqlite_file(&db).unwrap();
        assert_eq!((mode(&db), mode(&wal)), (0o600, 0o600));
        assert_eq!(
            std::fs::read(&db).unwrap(),
            b"x",
            "an existing database kept"
        );
    }
}
