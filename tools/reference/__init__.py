"""Independent numpy oracle of DeepSeek-V4.1-Flash (+ DSpark draft), written from
shared/spec/model.md.  Compute dtype: float64.  See README.md."""
