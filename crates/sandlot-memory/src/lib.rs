//! Sandlot semantic memory: agent memory as Markdown files in git, with an offline hybrid
//! (BM25 + vector) search index that is a rebuildable cache of the files.
//!
//! Entry points: [`Store`] (open/init a store; add, edit, rename, remove, supersede, search,
//! history, status, sync), [`watch`] (pick up direct edits), [`MiniLmEmbedder`] and
//! [`HttpEmbedder`] (the [`Embedder`] implementations) and [`memory_tool`] (Anthropic memory
//! tool commands over a store). Everything is `Send + Sync` and returns typed errors.

#![forbid(unsafe_code)]

pub mod chunk;
pub mod doc;
pub mod embed;
mod fts_tokens;
pub mod fusion;
mod git;
pub mod index;
mod kernels;
pub mod memory_tool;
mod minilm;
pub mod search;
pub mod store;
mod tree;
pub mod watch;

pub use doc::{Document, FrontMatter};
pub use embed::{EmbedError, Embedder, HttpEmbedder, MiniLmEmbedder};
pub use git::{Author, Commit, GitError};
pub use index::VectorScan;
pub use search::{Related, SearchHit, SearchMode, SearchQuery, TextSide, Validity};
pub use store::{
    FileStatus, Freshness, Memory, MemoryPatch, NewMemory, Store, StoreError, SyncReport,
    WriteOutcome,
};
pub use tree::TreeError;
pub use watch::{watch, WatchError, WatchOptions, Watcher};

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn public_types_are_send_and_sync() {
        assert_send_sync::<crate::Store>();
        assert_send_sync::<crate::MiniLmEmbedder>();
        assert_send_sync::<crate::HttpEmbedder>();
        assert_send_sync::<crate::StoreError>();
    }
}
