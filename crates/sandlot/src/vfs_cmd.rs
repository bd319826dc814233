//! `sandlot vfs ...`: owned by the sandlot-vfs work (issue 7).

#[derive(Debug, clap::Args)]
pub struct VfsArgs {}

pub fn run(_args: VfsArgs) -> anyhow::Result<i32> {
    anyhow::bail!("sandlot vfs is not available in this build")
}
