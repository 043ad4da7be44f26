//! What a point runs and what its rows record: the mode, the KV cache's kind and window,
//! the measured phase and how a row ended.

// `Default` on `Mode`, `Precision` and `MeterKind` only gives `Record::default()` (the base
// rows are built from, and the source of the column list) a value: every written row sets them.

vocab! {
    /// What a point runs.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum Mode {
        /// A decoder's prefill, then decode steps with a growing KV cache.
        #[default]
        Infer,
        /// Forward, backward and the optimizer's update.
        Train,
        /// An encoder's inference: one forward over the batch, no cache.
        Encode,
        /// An image pipeline: text encoders, denoising steps, the VAE decode
        /// (docs/src/guides/generation.md).
        Generate,
    }
}

vocab! {
    /// The two KV caches (ARCHITECTURE.md §4).
    #[derive(clap::ValueEnum)]
    case = "lowercase";
    pub enum KvKind {
        /// One (batch, n_kv, capacity, head_dim) tensor per layer for K and V, allocated once.
        Preallocated,
        /// Exact-fit growth by concatenation.
        Growing,
    }
}

vocab! {
    /// How many tokens a KV cache keeps for a sliding-window model (Mistral): `model` caps it at
    /// the model's window (a ring buffer of min(context, window) tokens, as vLLM and HF do),
    /// `full` keeps every token. The same for models without a window.
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum KvWindow {
        #[default]
        Model,
        Full,
    }
}

vocab! {
    /// A measured phase (ARCHITECTURE.md §4), in the order a point runs them.
    case = "snake_case";
    pub enum Phase {
        Load,
        /// The warm-up before a group's (or a point's) first measured phase. Only `oom`/`error`
        /// rows carry it: the warm-up itself is not measured.
        Warmup,
        Prefill,
        Decode,
        Total,
        Forward,
        Backward,
        Optimizer,
        StepTotal,
        /// Generation: the text encoders' forward.
        TextEncode,
        /// Generation: one denoiser step (a row per step).
        Denoise,
        /// Generation: the VAE decode of the final latents.
        VaeDecode,
    }
}

vocab! {
    /// How a row ended.
    case = "lowercase";
    pub enum Status {
        Ok,
        Oom,
        Error,
        Skipped,
    }
}
