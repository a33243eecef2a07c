//! `retry-agent forensics`: replay a dump offline into an incident report.
use std::path::PathBuf;

use clap::Args;

use crate::{
    forensics::{Options, analyse, render_diff, render_html, render_text},
    pipeline::PipelineConfig,
};

#[derive(Debug, Args)]
pub struct ForensicsArgs {
    /// The dump file to analyse.
    pub dump: PathBuf,
    /// Compare with a second dump (before/after a change): prints both reports' key figures.
    #[arg(long, value_name = "OTHER_DUMP")]
    pub diff: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page with an SVG timeline here.
    #[arg(long, value_name = "OUT_HTML")]
    pub html: Option<PathBuf>,
    /// Report from the derived records the live agent recorded instead of replaying the events.
    #[arg(long)]
    pub recorded: bool,
    /// Replay with the stage settings given to this command (the flags below, or their
    /// defaults) instead of the ones the live agent ran with, which the dump records. For
    /// "what if" replays, e.g. another retry budget.
    #[arg(long)]
    pub replay_flags: bool,
    #[command(flatten)]
    pub pipeline: PipelineConfig,
}

impl ForensicsArgs {
    fn options(&self) -> Options {
        Options {
            settings: self.pipeline.clone(),
            override_settings: self.replay_flags,
            recorded: self.recorded,
        }
    }
}

pub fn run(args: ForensicsArgs) -> anyhow::Result<()> {
    let opts = args.options();
    // Checked whether or not they are used: a what-if with a bad value must not look like a
    // replay with the live settings.
    crate::forensics::validate(&opts.settings)?;
    let report = analyse(&args.dump, &opts)?;
    if let Some(other) = &args.diff {
        let b = analyse(other, &opts)?;
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "a": report, "b": b }))?
            );
        } else {
            print!("{}", render_diff(&report, &b));
        }
        return Ok(());
    }
    if let Some(out) = &args.html {
        std::fs::write(out, render_html(&report))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", out.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}
