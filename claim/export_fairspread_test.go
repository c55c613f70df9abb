package claim

// SpreadStride is spreadStride, for the tests of the spread.
const SpreadStride = spreadStride
