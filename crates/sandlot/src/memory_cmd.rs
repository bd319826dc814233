//! `sandlot memory ...`: owned by the sandlot-memory work (issue 8).

#[derive(Debug, clap::Args)]
pub struct MemoryArgs {}

pub fn run(_args: MemoryArgs) -> anyhow::Result<i32> {
    anyhow::bail!("sandlot memory is not available in this build")
}
