"""The parts of a family's record (`families.family.Family`), one concern each, each small enough to read at once:
its checkpoint layout (`layout.CheckpointLayout`), its config.json schema with the checks of its fields
(`schema.ConfigSchema`), the settings it fixes and the structure it builds (`traits.Defaults`,
`traits.StackTraits`), its heads (`heads.Heads`), the encoder-decoders' output and generation
(`seq2seq.Seq2SeqTraits`), its tokenizer layout (`tokenizer.TokenizerLayout`) and what other verbs do with it
(`verbs.VerbDefaults`). None of these modules defines `FAMILY`, so the registry skips them."""
