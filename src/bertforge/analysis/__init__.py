"""Looking inside a model: fill-mask predictions (attention maps come from Encoder(output_attentions=True))."""
